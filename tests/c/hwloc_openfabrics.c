/* Lists the OpenFabrics OS devices hwloc finds, with the node GUID and
 * GID 1 it read from sysfs: "NAME GUID GID1", one line each. Used by
 * tests/tests/device_view.rs under `xroce run` (with
 * HWLOC_VIRTUAL_LINUX_OSDEV=1, which hwloc needs to report a parentless
 * device such as rxe on a veth). */
#include <hwloc.h>
#include <stdio.h>

int main(void)
{
	hwloc_topology_t topology;
	hwloc_obj_t obj = NULL;

	if (hwloc_topology_init(&topology) ||
	    hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_ALL) ||
	    hwloc_topology_load(topology)) {
		perror("hwloc topology");
		return 1;
	}
	while ((obj = hwloc_get_next_osdev(topology, obj)) != NULL) {
		const char *guid, *gid;

		if (obj->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS)
			continue;
		guid = hwloc_obj_get_info_by_name(obj, "NodeGUID");
		gid = hwloc_obj_get_info_by_name(obj, "Port1GID1");
		printf("%s %s %s\n", obj->name, guid ? guid : "-", gid ? gid : "-");
	}
	hwloc_topology_destroy(topology);
	return 0;
}

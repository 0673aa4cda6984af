#!/bin/bash
# Provisioning for the Soft-RoCE (rdma_rxe) peers that xroce is tested against.
#
# One source of truth for both ways of making such a peer:
#   - Vagrant runs it as root in each box (`vagrant up`, see Vagrantfile);
#   - `cargo xtask vm build` runs `provision.sh --packages` to learn what to
#     debootstrap, then `provision.sh --image` inside the chroot, and keys
#     its image cache on a hash of this file.
#
# Modes:
#   --packages   print the Debian packages a peer needs, one line, and exit
#   --image      configure a root file system being built (no kernel, no
#                services: the xtask initramfs has its own /init)
#   (none)       full provisioning of a running Debian 12 box: packages,
#                kernel modules, rxe0 on the private network's interface,
#                and a unit that brings rxe0 back after a reboot
set -euo pipefail

# rdma-core and its tools; kmod/iproute2 to set rxe up; tcpdump for
# captures; bpftool, libelf1 and zlib1g for xroce's binaries and tests;
# xdp-tools (xdp-loader, xdp-filter) for the libxdp dispatcher case;
# ucx-utils (ucx_perftest, ucx_info) and openmpi-bin (orted, mpirun; UCX
# 1.13.1 and Open MPI 4.1.4 as on a bookworm host) for the UCX and MPI cases.
PACKAGES="rdma-core ibverbs-utils ibverbs-providers perftest rdmacm-utils \
infiniband-diags iproute2 kmod procps iputils-ping tcpdump ethtool bpftool \
libelf1 zlib1g util-linux ca-certificates xdp-tools ucx-utils openmpi-bin"

# rxe needs a CRC32 implementation it asks for on demand (not a module
# dependency): without it `rdma link add` fails with "No such file or directory".
MODULES="crc32_generic crc32-pclmul rdma_rxe ib_uverbs rdma_ucm ib_umad"

write_rxe_up() {
    install -d /usr/local/sbin
    cat >/usr/local/sbin/rxe-up <<'EOF'
#!/bin/bash
# rxe-up [NETDEV]: load the modules and add rxe0 on NETDEV (default: the
# interface that carries the default route, else eth0). Idempotent.
set -eu
dev="${1:-}"
if [ -z "$dev" ]; then
    dev=$(ip -o route show default 2>/dev/null | awk '{print $5; exit}')
    dev="${dev:-eth0}"
fi
for m in crc32_generic crc32-pclmul rdma_rxe ib_uverbs rdma_ucm ib_umad; do
    modprobe -q "$m" 2>/dev/null || true
done
if ! rdma link show rxe0/1 >/dev/null 2>&1; then
    rdma link add rxe0 type rxe netdev "$dev"
fi
for _ in $(seq 1 100); do
    if rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE'; then
        rdma link show rxe0/1
        exit 0
    fi
    sleep 0.1
done
echo "rxe-up: rxe0 on $dev did not become ACTIVE" >&2
rdma link show >&2 || true
exit 1
EOF
    chmod 0755 /usr/local/sbin/rxe-up
}

case "${1:-}" in
--packages)
    echo $PACKAGES
    exit 0
    ;;
--image)
    export DEBIAN_FRONTEND=noninteractive
    # debootstrap --include installed $PACKAGES already; this catches
    # anything added later without changing how the image is made.
    missing=""
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends $missing
    fi
    write_rxe_up
    echo "xroce-peer" >/etc/hostname
    apt-get clean
    rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*
    exit 0
    ;;
"") ;;
*)
    echo "usage: $0 [--packages|--image]" >&2
    exit 2
    ;;
esac

# Full provisioning of a running box (Vagrant).
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $PACKAGES
write_rxe_up
printf '%s\n' $MODULES >/etc/modules-load.d/rxe.conf
# The private network is the interface that is not the NAT one (eth1 on
# libvirt boxes); XROCE_RXE_DEV overrides.
dev="${XROCE_RXE_DEV:-}"
if [ -z "$dev" ]; then
    dev=$(ip -o -4 addr show | awk -v want="${XROCE_PRIVATE_PREFIX:-192.168.77.}" 'index($4, want) == 1 {print $2; exit}')
fi
dev="${dev:-eth1}"
# Room for RoCE path MTU 4096 (4096 + 58 bytes of IP/UDP/BTH/ICRC).
mtu="${XROCE_MTU:-4200}"
cat >/etc/systemd/system/rxe0.service <<EOF
[Unit]
Description=Soft-RoCE rxe0 on $dev
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=/sbin/ip link set $dev mtu $mtu
ExecStart=/usr/local/sbin/rxe-up $dev

[Install]
WantedBy=multi-user.target
EOF
systemctl daemon-reload
systemctl enable --now rxe0.service
rdma link show

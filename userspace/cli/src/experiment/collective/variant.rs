//! What one collective experiment runs: its variants (a transport, and
//! over xroce how it recovers loss and its congestion control), from
//! `--transport`, `--recovery`, `--cc` and `--compare`.

use anyhow::bail;
use xroce::cc::CcKind;

use super::job::Transport;

/// What `--compare` varies.
pub(super) const AXES: [&str; 3] = ["tcp", "recovery", "cc"];

/// How xroce's ranks recover loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Recovery {
    GoBackN,
    SelectiveRepeat,
    Auto,
}

impl Recovery {
    pub(super) fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "gbn" => Recovery::GoBackN,
            "sr" => Recovery::SelectiveRepeat,
            "auto" => Recovery::Auto,
            _ => bail!("--recovery {s:?}: use gbn, sr or auto"),
        })
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Recovery::GoBackN => "gbn",
            Recovery::SelectiveRepeat => "sr",
            Recovery::Auto => "auto",
        }
    }

    /// The drop-in library's XROCE_SELECTIVE_REPEAT.
    pub(super) fn env_value(self) -> &'static str {
        match self {
            Recovery::GoBackN => "off",
            Recovery::SelectiveRepeat => "on",
            Recovery::Auto => "auto",
        }
    }
}

/// One configuration the experiment runs: a transport, and over xroce how
/// it recovers loss and its congestion control.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Variant {
    /// "xroce", "tcp", or what it varies: "xroce-sr", "xroce-dcqcn".
    pub(super) name: String,
    pub(super) transport: Transport,
    pub(super) recovery: Recovery,
    pub(super) cc: CcKind,
}

/// The variants to run, in order: without `compare`, each of `transports`
/// with `recovery` and `cc`; with it, each axis's variants (what an axis
/// does not vary is `recovery` and `cc`), each configuration once.
pub(super) fn variants(
    transports: &[Transport],
    recovery: Recovery,
    cc: CcKind,
    compare: &[String],
) -> anyhow::Result<Vec<Variant>> {
    let base = |transport: Transport| Variant {
        name: transport.name().to_string(),
        transport,
        recovery,
        cc,
    };
    if compare.is_empty() {
        return Ok(transports.iter().map(|&t| base(t)).collect());
    }
    let mut out: Vec<Variant> = Vec::new();
    for axis in compare {
        let more = match axis.as_str() {
            "tcp" => vec![base(Transport::Xroce), base(Transport::Tcp)],
            "recovery" => [Recovery::GoBackN, Recovery::SelectiveRepeat]
                .into_iter()
                .map(|r| Variant {
                    name: format!("xroce-{}", r.name()),
                    recovery: r,
                    ..base(Transport::Xroce)
                })
                .collect(),
            "cc" => CcKind::ALL
                .into_iter()
                .map(|c| Variant {
                    name: format!("xroce-{}", c.name()),
                    cc: c,
                    ..base(Transport::Xroce)
                })
                .collect(),
            other => bail!("--compare {other:?}: use tcp, recovery or cc"),
        };
        for v in more {
            let same = |o: &Variant| {
                (o.transport, o.recovery, o.cc) == (v.transport, v.recovery, v.cc)
                    // Over TCP neither matters.
                    || (o.transport == Transport::Tcp && v.transport == Transport::Tcp)
            };
            if !out.iter().any(same) {
                out.push(v);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Variant]) -> Vec<&str> {
        v.iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn recovery_maps_to_the_libraries_variable() {
        for (flag, env) in [("gbn", "off"), ("sr", "on"), ("auto", "auto")] {
            let r = Recovery::parse(flag).unwrap();
            assert_eq!((r.name(), r.env_value()), (flag, env));
        }
        assert!(Recovery::parse("irn").is_err());
    }

    #[test]
    fn variants_follow_the_axes_each_configuration_once() {
        let both = [Transport::Xroce, Transport::Tcp];
        let v = variants(&both, Recovery::Auto, CcKind::Dcqcn, &[]).unwrap();
        assert_eq!(names(&v), ["xroce", "tcp"]);
        assert!(v
            .iter()
            .all(|v| v.cc == CcKind::Dcqcn && v.recovery == Recovery::Auto));

        let all: Vec<String> = AXES.iter().map(|s| s.to_string()).collect();
        let v = variants(&both, Recovery::Auto, CcKind::None, &all).unwrap();
        assert_eq!(
            names(&v),
            [
                "xroce",
                "tcp",
                "xroce-gbn",
                "xroce-sr",
                "xroce-dcqcn",
                "xroce-timely",
                "xroce-swift"
            ]
        );
        // "xroce-none" is "xroce" (auto recovery, no cc): run once.
        let sr = &v[3];
        assert_eq!(
            (sr.transport, sr.recovery, sr.cc),
            (Transport::Xroce, Recovery::SelectiveRepeat, CcKind::None)
        );
        let swift = &v[6];
        assert_eq!((swift.recovery, swift.cc), (Recovery::Auto, CcKind::Swift));

        // What an axis does not vary comes from --recovery and --cc.
        let v = variants(
            &both,
            Recovery::GoBackN,
            CcKind::Swift,
            &["recovery".into()],
        )
        .unwrap();
        assert_eq!(names(&v), ["xroce-gbn", "xroce-sr"]);
        assert!(v.iter().all(|v| v.cc == CcKind::Swift));
        let v = variants(
            &both,
            Recovery::SelectiveRepeat,
            CcKind::None,
            &["cc".into()],
        )
        .unwrap();
        assert_eq!(
            names(&v),
            ["xroce-none", "xroce-dcqcn", "xroce-timely", "xroce-swift"]
        );
        assert!(v.iter().all(|v| v.recovery == Recovery::SelectiveRepeat));
    }
}

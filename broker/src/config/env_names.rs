//! Which `NARAD_*` names in the environment the server refuses (SPEC §8).
//!
//! A name the broker does not read is a typo or a leftover that someone meant to change a
//! setting: `NARAD_SECURITY_ENABLE=true` silently ignored would leave a node open. But the
//! `NARAD_` prefix is also what scripts, the CLI's users and Kubernetes use for their own
//! names (`NARAD_BIN`, `NARAD_VERSION`; the service links of a Service called `narad-…`).
//! So the rule is by *section*: a name whose first word after `NARAD_` is the first word
//! of a name the server or the CLI reads (`HTTP`, `CLUSTER`, `STORAGE`, `TOPIC`,
//! `SECURITY`, `TEST`, …) must be one of those names, or the node does not start and the
//! error names the nearest known one. Any other `NARAD_*` name is left to its owner and
//! reported once in the log. Kubernetes service-link names (`NARAD_X_SERVICE_HOST`,
//! `NARAD_X_SERVICE_PORT[_NAME]`, `NARAD_X_PORT[_N_TCP[_PROTO|_PORT|_ADDR]]`) are never
//! refused: the kubelet writes them into every pod of a namespace that has such a Service.

use std::collections::BTreeSet;

use super::{bad, ConfigError};

/// What [`check`] found: the `NARAD_*` names that are neither read nor refused.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EnvReport {
    /// Names outside every section the server reads (for one log line at start).
    pub ignored: Vec<String>,
}

/// Checks the `NARAD_*` names of an environment against `known` (every name the server and
/// the CLI read). Names without the prefix are not looked at.
pub fn check<'a>(
    names: impl IntoIterator<Item = &'a str>,
    known: &BTreeSet<String>,
) -> Result<EnvReport, ConfigError> {
    let sections: BTreeSet<&str> = known.iter().filter_map(|k| section(k)).collect();
    let mut refused = Vec::new();
    let mut report = EnvReport::default();
    for name in names {
        if !name.starts_with("NARAD_") || known.contains(name) || is_service_link(name) {
            continue;
        }
        if section(name).is_some_and(|s| sections.contains(s)) {
            refused.push(match nearest(name, known) {
                Some(k) => format!("{name} (did you mean {k}?)"),
                None => name.to_string(),
            });
        } else {
            report.ignored.push(name.to_string());
        }
    }
    if refused.is_empty() {
        report.ignored.sort();
        return Ok(report);
    }
    refused.sort();
    Err(bad(format!(
        "unknown environment variable{} {}: the broker reads no such setting (SPEC §8 lists \
         every NARAD_* name); unset it or correct its name",
        if refused.len() == 1 { "" } else { "s" },
        refused.join(", ")
    )))
}

/// `HTTP` of `NARAD_HTTP_ADDR`; `DATA` of `NARAD_DATA_DIR`; `None` without a word.
fn section(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("NARAD_")?;
    let word = rest.split('_').next().unwrap_or_default();
    (!word.is_empty()).then_some(word)
}

/// The known name closest to `name`, if it is close enough to be the one meant: one that
/// `name` is the start of (`NARAD_CLUSTER_TLS_CERT` → `…_CERT_FILE`), else the fewest edits.
fn nearest<'k>(name: &str, known: &'k BTreeSet<String>) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (!k.starts_with(name), strsim::levenshtein(name, k), k))
        .filter(|(not_prefix, d, k)| !not_prefix || *d <= 3.max(k.len() / 4))
        .min()
        .map(|(_, _, k)| k.as_str())
}

/// The environment variables the kubelet derives from a Service's name (upper-cased, `-` →
/// `_`) and ports: `<S>_SERVICE_HOST`, `<S>_SERVICE_PORT`, `<S>_SERVICE_PORT_<PORT_NAME>`,
/// `<S>_PORT`, `<S>_PORT_<N>_<PROTO>` and that with `_PROTO`, `_PORT` or `_ADDR`.
pub fn is_service_link(name: &str) -> bool {
    let words: Vec<&str> = name.split('_').collect();
    // words[0] is NARAD, part of the Service's name; the suffix starts after it.
    (1..words.len()).any(|i| {
        let rest = &words[i..];
        match rest {
            ["SERVICE", "HOST"] | ["SERVICE", "PORT"] | ["PORT"] => true,
            ["SERVICE", "PORT", name @ ..] => {
                !name.is_empty() && name.iter().all(|w| !w.is_empty())
            }
            ["PORT", n, proto, tail @ ..] => {
                !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && matches!(*proto, "TCP" | "UDP" | "SCTP")
                    && matches!(tail, [] | ["PROTO"] | ["PORT"] | ["ADDR"])
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn known() -> BTreeSet<String> {
        [
            "NARAD_HTTP_ADDR",
            "NARAD_SECURITY_ENABLED",
            "NARAD_DATA_DIR",
            "NARAD_TEST_KNOBS",
            "NARAD_ADDR",
        ]
        .map(String::from)
        .into()
    }

    #[test]
    fn a_misspelt_setting_is_refused_with_the_name_meant() {
        let e = check(["NARAD_SECURITY_ENABLE", "PATH"], &known()).unwrap_err();
        assert!(
            e.0.contains("NARAD_SECURITY_ENABLE (did you mean NARAD_SECURITY_ENABLED?)"),
            "{e}"
        );
        let e = check(["NARAD_SECURITY"], &known()).unwrap_err();
        assert!(
            e.0.contains("(did you mean NARAD_SECURITY_ENABLED?)"),
            "{e}"
        );
        let e = check(["NARAD_HTTP_LISTEN", "NARAD_TEST_SEED"], &known()).unwrap_err();
        assert!(e.0.contains("variables NARAD_HTTP_LISTEN"), "{e}");
        assert!(e.0.contains("NARAD_TEST_SEED"), "{e}");
        assert!(!e.0.contains("did you mean"), "{e}");
    }

    #[test]
    fn known_names_and_other_owners_names_pass() {
        let r = check(
            [
                "NARAD_HTTP_ADDR",
                "NARAD_ADDR",
                "NARAD_BIN",
                "NARAD_VERSION",
                "NARAD_",
                "HOME",
            ],
            &known(),
        )
        .unwrap();
        assert_eq!(r.ignored, ["NARAD_", "NARAD_BIN", "NARAD_VERSION"]);
    }

    #[test]
    fn kubernetes_service_links_pass_even_in_a_section() {
        // Services `narad`, `narad-http` and `narad-data-api` with ports 7942 and `metrics`.
        for name in [
            "NARAD_SERVICE_HOST",
            "NARAD_SERVICE_PORT",
            "NARAD_SERVICE_PORT_METRICS",
            "NARAD_PORT",
            "NARAD_PORT_7942_TCP",
            "NARAD_PORT_7942_TCP_PROTO",
            "NARAD_PORT_7942_TCP_PORT",
            "NARAD_PORT_7942_TCP_ADDR",
            "NARAD_HTTP_SERVICE_HOST",
            "NARAD_HTTP_PORT_9090_UDP_ADDR",
            "NARAD_DATA_API_SERVICE_PORT_HTTP_API",
        ] {
            assert!(is_service_link(name), "{name}");
            assert_eq!(
                check([name], &known()).unwrap().ignored,
                Vec::<String>::new()
            );
        }
        for name in [
            "NARAD_HTTP_ADDR",
            "NARAD_PORT_X_TCP",
            "NARAD_PORT_7942_HTTP",
            "NARAD_PORT_7942_TCP_HOST",
            "NARAD_SERVICE_HOSTNAME",
            "NARAD_SERVICE_PORT_",
        ] {
            assert!(!is_service_link(name), "{name}");
        }
    }

    #[test]
    fn no_name_the_server_reads_looks_like_a_service_link() {
        for name in super::super::known_env_names() {
            assert!(!is_service_link(&name), "{name}");
        }
    }

    proptest! {
        /// Any environment: no panic; a known name is never refused nor reported; a
        /// refusal names only `NARAD_` names.
        #[test]
        fn check_never_refuses_known_names(extra in proptest::collection::vec("[A-Z_]{0,24}", 0..8)) {
            let known = known();
            let mut names: Vec<String> = known.iter().cloned().collect();
            names.extend(extra.iter().map(|e| format!("NARAD_{e}")));
            names.extend(extra.iter().cloned());
            match check(names.iter().map(String::as_str), &known) {
                Ok(r) => prop_assert!(r.ignored.iter().all(|n| !known.contains(n))),
                Err(e) => {
                    for k in &known {
                        prop_assert!(!e.0.contains(&format!("{k} ")) && !e.0.contains(&format!("{k},")), "{}", e);
                    }
                }
            }
        }
    }
}

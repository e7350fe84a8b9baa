//! The operator's own admission checks: the CEL rules of the CRDs (which a 1.20 API server
//! ignores) plus value rules, checked against what the operator last applied (recorded in
//! `status`) since a controller never sees the previous spec. A failed check sets
//! `Ready=False`/`Synced=False` with reason `Invalid` and changes nothing.

use super::*;

/// Longest visibility timeout and delay: one year.
pub const ONE_YEAR_MS: u64 = 365 * 24 * 3_600_000;
/// Shortest non-zero retention: one hour.
pub const MIN_RETENTION_MS: u64 = 3_600_000;

/// Checks a NaradCluster spec, and its change against the applied status.
pub fn check_cluster(
    spec: &NaradClusterSpec,
    applied: Option<&NaradClusterStatus>,
) -> Result<(), String> {
    let initial = spec.effective_initial_cluster_size();
    if initial < 1 || initial % 2 == 0 {
        return Err(format!("initialClusterSize must be odd, got {initial}"));
    }
    if spec.replicas < initial || (spec.replicas != 1 && spec.replicas < 3) {
        return Err(format!(
            "replicas must be 1, or >= 3 and >= initialClusterSize ({initial}), got {}",
            spec.replicas
        ));
    }
    if let Some(p) = spec.metrics_port {
        if p == crate::resources::API_PORT || p == crate::resources::CLUSTER_PORT {
            return Err(format!(
                "metricsPort {p} is the API or the cluster port; choose another"
            ));
        }
    }
    let new_size = parse_quantity(&spec.storage.size)
        .ok_or_else(|| format!("storage.size {:?} is not a quantity", spec.storage.size))?;
    if let Some(a) = applied {
        if let Some(old) = a.initial_cluster_size {
            if old != initial {
                return Err(format!(
                    "initialClusterSize is immutable (was {old}, now {initial})"
                ));
            }
        }
        if let Some(old) = a.storage_size.as_deref().and_then(parse_quantity) {
            if new_size < old {
                return Err(format!(
                    "storage.size may only grow (was {}, now {})",
                    a.storage_size.as_deref().unwrap_or_default(),
                    spec.storage.size
                ));
            }
        }
    }
    for (what, v) in [
        (
            "defaults.visibilityTimeout",
            &spec.defaults.visibility_timeout,
        ),
        ("defaults.maxConsumeWait", &spec.defaults.max_consume_wait),
    ] {
        parse_duration_ms(v).map_err(|e| format!("{what}: {e}"))?;
    }
    check_retention(&spec.defaults.retention).map_err(|e| format!("defaults.retention: {e}"))?;
    for h in &spec.remotes.allowed_hosts {
        check_allowed_host(h).map_err(|e| format!("remotes.allowedHosts: {e}"))?;
    }
    Ok(())
}

/// One `remotes.allowedHosts` entry, as the broker parses `NARAD_REMOTES_ALLOWED_HOSTS`
/// (a bad entry would stop every broker at start): `*`, `*.<host name>`, an IP address
/// (IPv6 optionally in brackets), a CIDR range or a host name. No commas or spaces: the
/// entries are joined with commas.
pub fn check_allowed_host(raw: &str) -> Result<(), String> {
    if raw.is_empty() || raw.contains(',') || raw.chars().any(char::is_whitespace) {
        return Err(format!(
            "{raw:?} is not a host name, *.<host name>, an IP address, a CIDR range or *"
        ));
    }
    narad_api::hosts::HostPolicy::parse([raw])
        .map(drop)
        .map_err(|e| e.trim_start_matches("remotes.allowed_hosts: ").to_string())
}

fn check_retention(s: &str) -> Result<u64, String> {
    let ms = parse_retention_ms(s)?;
    if ms != 0 && ms < MIN_RETENTION_MS {
        return Err(format!("retention must be forever or >= 1h, got {s}"));
    }
    Ok(ms)
}

/// Checks a Topic spec, and its change against the applied status.
pub fn check_topic(
    topic_name: &str,
    spec: &TopicSpec,
    applied: &TopicStatus,
) -> Result<(), String> {
    check_topic_name(topic_name)?;
    if let Some(old) = &applied.topic_name {
        if old != topic_name {
            return Err(format!(
                "name is immutable (was {old:?}, now {topic_name:?})"
            ));
        }
    }
    if let Some(p) = spec.partitions {
        if !(3..=108).contains(&p) {
            return Err(format!("partitions must be 3-108, got {p}"));
        }
    }
    if let Some(r) = &spec.retention {
        check_retention(r)?;
    }
    if let Some(v) = &spec.visibility_timeout {
        if parse_duration_ms(v)? > ONE_YEAR_MS {
            return Err(format!("visibilityTimeout must be <= 1 year, got {v}"));
        }
    }
    if let Some(b) = &spec.retry_backoff {
        check_retry_backoff(b)?;
    }
    if let Some(d) = &spec.dead_letter {
        check_dead_letter(d, topic_name)?;
    }
    let replica = spec.replica.unwrap_or(false);
    let delay = spec.delay.as_deref().map(parse_duration_ms).transpose()?;
    if spec.parent.is_none() && (replica || delay.is_some()) {
        return Err("replica and delay need parent".into());
    }
    if spec.parent.as_deref() == Some(topic_name) {
        return Err("a topic cannot be its own parent".into());
    }
    if spec.parent.is_some() && !spec.remote_children.is_empty() {
        return Err("remoteChildren are for parents only".into());
    }
    if let Some(d) = delay {
        if d == 0 || d > ONE_YEAR_MS {
            return Err("delay must be between 1ms and 1 year".into());
        }
    }
    if let Some(old) = applied.replica {
        if old != replica {
            return Err("replica is immutable".into());
        }
    }
    // `replica` is recorded with `delayMs` whenever the operator applied the topic (an
    // observed one records neither).
    if applied.replica.is_some() && applied.delay_ms != delay {
        return Err("delay is immutable".into());
    }
    Ok(())
}

/// `deadLetter`: maxDeliveries 0 (off), or 1-1000 with a valid topic name other than this
/// topic's; returns (topic, maxDeliveries), `("", 0)` when off.
pub fn check_dead_letter(d: &DeadLetterSpec, topic_name: &str) -> Result<(String, u32), String> {
    match d.max_deliveries {
        0 => Ok((String::new(), 0)),
        n if n > 1000 => Err(format!(
            "deadLetter.maxDeliveries must be 1-1000 (0 turns it off), got {n}"
        )),
        n => {
            let topic = d.topic.as_deref().unwrap_or_default();
            check_topic_name(topic).map_err(|e| format!("deadLetter.topic: {e}"))?;
            if topic == topic_name {
                return Err("a topic cannot be its own dead-letter topic".into());
            }
            Ok((topic.to_string(), n))
        }
    }
}

/// Longest retry backoff the broker takes: 12 hours.
const TWELVE_HOURS_MS: u64 = 12 * 3_600_000;

/// `retryBackoff`: `min` "0s" (off), or 1ms <= min <= max <= 12h; returns (min, max) in ms.
pub fn check_retry_backoff(b: &RetryBackoffSpec) -> Result<(u64, u64), String> {
    let (min, max) = (parse_duration_ms(&b.min)?, parse_duration_ms(&b.max)?);
    if min != 0 && (max < min || max > TWELVE_HOURS_MS) {
        return Err(format!(
            "retryBackoff needs 1ms <= min <= max <= 12h (or min 0s for none), got min {} and max {}",
            b.min, b.max
        ));
    }
    Ok((min, max))
}

/// `dedupWindow`: 1s to 24h, in ms.
pub fn check_dedup_window(s: &str) -> Result<u64, String> {
    let ms = parse_duration_ms(s)?;
    if !narad_api::DEDUP_WINDOW_MS.contains(&ms) {
        return Err(format!("dedupWindow must be 1s to 24h, got {s}"));
    }
    Ok(ms)
}

/// Topic names: 1-200 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn check_topic_name(n: &str) -> Result<(), String> {
    if n.is_empty()
        || n.len() > 200
        || n == "."
        || n == ".."
        || !n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!("invalid topic name {n:?}"));
    }
    Ok(())
}

/// Checks a User spec, and its change against the applied status.
pub fn check_user(username: &str, applied: &UserStatus) -> Result<(), String> {
    if username.is_empty()
        || username.len() > 64
        || !username
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!("invalid username {username:?}"));
    }
    if username == "admin" {
        return Err("the root user admin cannot be managed".into());
    }
    if let Some(old) = &applied.username {
        if old != username {
            return Err(format!(
                "username is immutable (was {old:?}, now {username:?})"
            ));
        }
    }
    Ok(())
}

/// Checks a Grant spec.
pub fn check_grant(spec: &GrantSpec) -> Result<(), String> {
    match (spec.action, spec.patterns.is_empty()) {
        (GrantAction::Admin, false) => return Err("admin takes no patterns".into()),
        (a, true) if a != GrantAction::Admin => {
            return Err(format!("{} needs at least one pattern", a.as_str()))
        }
        _ => {}
    }
    for p in &spec.patterns {
        let body = p.strip_suffix('*').unwrap_or(p);
        if p.is_empty()
            || body.len() > 255
            || !body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(format!("invalid pattern {p:?}"));
        }
    }
    Ok(())
}

/// A Kubernetes quantity (`10Gi`, `500M`, `1.5Ti`, `1000`) as a number of base units.
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => return None,
    };
    Some(n * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn cluster_spec() -> NaradClusterSpec {
        serde_json::from_value(serde_json::json!({"version": "1.0.0"})).unwrap()
    }

    fn topic_spec(v: serde_json::Value) -> TopicSpec {
        let mut base = serde_json::json!({"clusterRef": {"name": "prod"}});
        base.as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn cluster_defaults_and_rules() {
        let s = cluster_spec();
        assert_eq!(s.replicas, 3);
        assert_eq!(s.effective_initial_cluster_size(), 3);
        assert_eq!(s.defaults.retention, "12h");
        assert!(check_cluster(&s, None).is_ok());

        let mut one = s.clone();
        one.replicas = 1;
        assert_eq!(one.effective_initial_cluster_size(), 1);
        assert!(check_cluster(&one, None).is_ok());

        let mut two = s.clone();
        two.replicas = 2;
        assert!(check_cluster(&two, None).is_err(), "2 replicas");

        let mut even = s.clone();
        even.replicas = 5;
        even.initial_cluster_size = Some(4);
        assert!(check_cluster(&even, None).unwrap_err().contains("odd"));

        let mut small = s.clone();
        small.replicas = 3;
        small.initial_cluster_size = Some(5);
        assert!(check_cluster(&small, None).is_err(), "replicas < initial");

        let mut metrics = s.clone();
        metrics.metrics_port = Some(9090);
        assert!(check_cluster(&metrics, None).is_ok());
        for clash in [7942, 7943] {
            metrics.metrics_port = Some(clash);
            assert!(
                check_cluster(&metrics, None)
                    .unwrap_err()
                    .contains("metricsPort"),
                "{clash}"
            );
        }
    }

    #[test]
    fn allowed_hosts_are_checked_as_the_broker_parses_them() {
        for ok in [
            "*",
            "queue.example.com",
            "Queue.Example.com.",
            "*.example.com",
            "10.0.0.0/8",
            "192.168.1.7",
            "fd00::/8",
            "::1",
            "[::1]",
            "narad-dr",
        ] {
            assert_eq!(check_allowed_host(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "a,b",
            "a b",
            "http://queue.example.com",
            "queue.example.com:443",
            "*.",
            "**.example.com",
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0.0/x",
            "under_score.example.com",
            "a..b",
        ] {
            assert!(check_allowed_host(bad).is_err(), "{bad:?}");
        }
        let mut s = cluster_spec();
        s.remotes.allowed_hosts = vec!["*.corp".into(), "https://x".into()];
        let e = check_cluster(&s, None).unwrap_err();
        assert!(
            e.contains("remotes.allowedHosts") && e.contains("https://x"),
            "{e}"
        );
    }

    #[test]
    fn cluster_immutable_and_grow_only() {
        let s = cluster_spec();
        let applied = NaradClusterStatus {
            initial_cluster_size: Some(3),
            storage_size: Some("10Gi".into()),
            ..Default::default()
        };
        assert!(check_cluster(&s, Some(&applied)).is_ok());
        let mut changed = s.clone();
        changed.replicas = 5;
        changed.initial_cluster_size = Some(5);
        assert!(check_cluster(&changed, Some(&applied))
            .unwrap_err()
            .contains("immutable"));
        let mut shrink = s.clone();
        shrink.storage.size = "5Gi".into();
        assert!(check_cluster(&shrink, Some(&applied))
            .unwrap_err()
            .contains("only grow"));
        let mut grow = s.clone();
        grow.storage.size = "0.5Ti".into();
        assert!(check_cluster(&grow, Some(&applied)).is_ok());
        let mut bad = s;
        bad.storage.size = "lots".into();
        assert!(check_cluster(&bad, None).is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("10Gi"), Some(10.0 * 1024f64.powi(3)));
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("1k"), Some(1000.0));
        assert_eq!(parse_quantity("1000"), Some(1000.0));
        assert!(parse_quantity("1Gi").unwrap() > parse_quantity("1G").unwrap());
        assert_eq!(parse_quantity("Gi"), None);
        assert_eq!(parse_quantity("1Xi"), None);
    }

    #[test]
    fn topic_rules() {
        let none = TopicStatus::default();
        assert!(check_topic("orders", &topic_spec(serde_json::json!({})), &none).is_ok());
        let s = topic_spec(serde_json::json!({"partitions": 2}));
        assert!(check_topic("orders", &s, &none).is_err());
        let s = topic_spec(serde_json::json!({"retention": "30m"}));
        assert!(check_topic("orders", &s, &none)
            .unwrap_err()
            .contains(">= 1h"));
        for r in ["forever", "0", "1h", "7d"] {
            let s = topic_spec(serde_json::json!({ "retention": r }));
            assert!(check_topic("orders", &s, &none).is_ok(), "{r}");
        }
        let s = topic_spec(serde_json::json!({"replica": true}));
        assert!(
            check_topic("orders", &s, &none).is_err(),
            "replica w/o parent"
        );
        let s = topic_spec(serde_json::json!({"delay": "1h"}));
        assert!(
            check_topic("orders", &s, &none).is_err(),
            "delay w/o parent"
        );
        let s = topic_spec(serde_json::json!({"parent": "orders"}));
        assert!(check_topic("orders", &s, &none).is_err(), "own parent");
        let s = topic_spec(serde_json::json!({"parent": "raw", "remoteChildren": [
            {"name": "dr", "url": "https://dr.example.com"}]}));
        assert!(
            check_topic("orders", &s, &none).is_err(),
            "remote on a child"
        );
        assert!(check_topic("..", &topic_spec(serde_json::json!({})), &none).is_err());
        assert!(check_topic("a/b", &topic_spec(serde_json::json!({})), &none).is_err());
    }

    #[test]
    fn topic_immutables_against_applied() {
        let applied = TopicStatus {
            topic_name: Some("orders".into()),
            replica: Some(false),
            delay_ms: Some(3_600_000),
            ..Default::default()
        };
        let s = topic_spec(serde_json::json!({"parent": "raw", "delay": "1h"}));
        assert!(check_topic("orders", &s, &applied).is_ok());
        assert!(check_topic("orders2", &s, &applied)
            .unwrap_err()
            .contains("name is immutable"));
        let s = topic_spec(serde_json::json!({"parent": "raw", "delay": "2h"}));
        assert!(check_topic("orders", &s, &applied)
            .unwrap_err()
            .contains("delay"));
        let s = topic_spec(serde_json::json!({"parent": "raw", "delay": "1h", "replica": true}));
        assert!(check_topic("orders", &s, &applied)
            .unwrap_err()
            .contains("replica"));
        // An observed topic (managementPolicy Observe) recorded its name only: nothing was
        // applied, so there is no delay to keep.
        let observed = TopicStatus {
            topic_name: Some("orders".into()),
            ..Default::default()
        };
        let s = topic_spec(serde_json::json!({"parent": "raw", "delay": "2h"}));
        assert!(check_topic("orders", &s, &observed).is_ok());
    }

    #[test]
    fn user_and_grant_rules() {
        let none = UserStatus::default();
        assert!(check_user("billing", &none).is_ok());
        assert!(check_user("admin", &none).is_err());
        assert!(check_user("a b", &none).is_err());
        let applied = UserStatus {
            username: Some("billing".into()),
            ..Default::default()
        };
        assert!(check_user("billing2", &applied).is_err());

        let g = |action: GrantAction, patterns: &[&str]| GrantSpec {
            cluster_ref: ClusterRef {
                name: "prod".into(),
            },
            user: "billing".into(),
            action,
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
        };
        assert!(check_grant(&g(GrantAction::Produce, &["orders-*"])).is_ok());
        assert!(check_grant(&g(GrantAction::Consume, &["*"])).is_ok());
        assert!(check_grant(&g(GrantAction::Admin, &[])).is_ok());
        assert!(check_grant(&g(GrantAction::Admin, &["x"])).is_err());
        assert!(check_grant(&g(GrantAction::Create, &[])).is_err());
        assert!(check_grant(&g(GrantAction::Produce, &["a*b"])).is_err());
        assert!(check_grant(&g(GrantAction::Produce, &[""])).is_err());
    }
}

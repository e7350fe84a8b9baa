//! Types shared by the resources: references, deletion policy, conditions, durations.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// API group of all four resources.
pub const GROUP: &str = "narad.io";
/// The finalizer that Topic, User and Grant resources carry while they exist on the broker.
pub const FINALIZER: &str = "narad.io/finalizer";
/// Field manager of the operator's server-side applies.
pub const MANAGER: &str = "narad-operator";
/// The label a Secret must carry (with value [`CREDENTIALS_LABEL_VALUE`]) before a Narad
/// resource may use it: the Secret's owner consents that Narad resources in its namespace
/// hand its keys to brokers (User passwords, remote-child credentials, a NaradCluster's
/// security and cluster-TLS Secrets). The operator never fetches the data of a Secret
/// without it, and never uses a NaradCluster's security or TLS Secret as a User password or
/// remote-child credentials, labelled or not. The Secrets the operator creates carry it.
pub const CREDENTIALS_LABEL: &str = "narad.io/credentials";
/// The value of [`CREDENTIALS_LABEL`] that marks a Secret for Narad.
pub const CREDENTIALS_LABEL_VALUE: &str = "true";

/// Names the NaradCluster (same namespace) whose broker holds the object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ClusterRef {
    /// Name of the NaradCluster in this namespace.
    pub name: String,
}

/// Names a Secret in this namespace; it must carry the label `narad.io/credentials: "true"`
/// (the operator refuses it otherwise, reason `SecretNotLabelled`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretRef {
    /// Name of the Secret in this namespace (labelled `narad.io/credentials: "true"`).
    pub name: String,
}

/// A key of a Secret in this namespace; the Secret must carry the label
/// `narad.io/credentials: "true"` (the operator refuses it otherwise, reason
/// `SecretNotLabelled`) and must not be a NaradCluster's security or TLS Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Name of the Secret in this namespace (labelled `narad.io/credentials: "true"`).
    pub name: String,
    /// Key in the Secret's data.
    #[serde(default = "default_password_key")]
    pub key: String,
}

fn default_password_key() -> String {
    "password".into()
}

/// What deleting the resource does to the broker object.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the broker object (topic or user), then release the resource.
    #[default]
    Delete,
    /// Leave the broker object; only release the resource.
    Retain,
    /// Topics only: delete the broker topic once nothing is waiting or in flight in it; until
    /// then the resource stays (reason `NotEmpty`).
    DeleteIfEmpty,
}

/// Schema of a free-form JSON object kept as is (`x-kubernetes-preserve-unknown-fields`).
pub fn opaque_object(_: &mut SchemaGenerator) -> Schema {
    serde_json::from_value(serde_json::json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    }))
    .expect("invariant: valid schema")
}

/// Schema of a list of free-form JSON objects.
pub fn opaque_array(_: &mut SchemaGenerator) -> Schema {
    serde_json::from_value(serde_json::json!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    }))
    .expect("invariant: valid schema")
}

/// Pattern of durations in resources: `<number><unit>` parts with `ms s m h d` (`30s`, `12h`,
/// `7d`, `1h30m`).
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+$";
/// [`DURATION_PATTERN`] or `forever` (retention).
pub const RETENTION_PATTERN: &str = r"^(([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+|forever|0)$";

/// Parses a resource duration (`ms s m h d`) into milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    narad_api::duration::parse_human_duration(s)
        .map(|d: Duration| d.as_millis() as u64)
        .map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Parses a retention: a duration, or `forever`/`0` (= `0` on the wire).
pub fn parse_retention_ms(s: &str) -> Result<u64, String> {
    match s {
        "forever" | "0" => Ok(0),
        _ => parse_duration_ms(s),
    }
}

/// String-to-string map (labels, annotations, node selector).
pub type StringMap = BTreeMap<String, String>;

/// Condition types.
pub mod cond {
    pub const READY: &str = "Ready";
    pub const SYNCED: &str = "Synced";
    pub const AVAILABLE: &str = "Available";
    pub const PROGRESSING: &str = "Progressing";
    pub const UPGRADING: &str = "Upgrading";
    pub const QUORUM_HEALTHY: &str = "QuorumHealthy";
    pub const DEGRADED: &str = "Degraded";
}

/// Sets (or adds) the condition `type_`, keeping its `lastTransitionTime` when the status
/// did not change. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = if status { "True" } else { "False" }.to_string();
    // An empty message is stored as null by a 1.20 API server, which then refuses the
    // status (`message` must be a string): always say something.
    let message = if message.is_empty() { reason } else { message };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status
                || c.reason != reason
                || c.message != message
                || c.observed_generation != generation;
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// The condition `type_`, if present.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("12h"), Ok(43_200_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert!(parse_duration_ms("7 days").is_err());
        assert!(parse_duration_ms("").is_err());
        assert_eq!(parse_retention_ms("forever"), Ok(0));
        assert_eq!(parse_retention_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms("1d12h"), Ok(129_600_000));
        assert!(parse_retention_ms("never").is_err());
    }

    #[test]
    fn conditions_keep_transition_time() {
        let mut c = Vec::new();
        assert!(set_condition(
            &mut c,
            "Ready",
            false,
            "Waiting",
            "w",
            Some(1),
            &t(10)
        ));
        assert!(!set_condition(
            &mut c,
            "Ready",
            false,
            "Waiting",
            "w",
            Some(1),
            &t(20)
        ));
        assert_eq!(c[0].last_transition_time, t(10));
        assert!(set_condition(
            &mut c,
            "Ready",
            false,
            "Other",
            "x",
            Some(2),
            &t(30)
        ));
        assert_eq!(
            c[0].last_transition_time,
            t(10),
            "same status keeps the time"
        );
        assert!(set_condition(
            &mut c,
            "Ready",
            true,
            "Synced",
            "",
            Some(2),
            &t(40)
        ));
        assert_eq!(c[0].last_transition_time, t(40));
        assert!(is_true(&c, "Ready"));
        assert!(!is_true(&c, "Synced"));
        assert_eq!(c.len(), 1);
    }
}

//! Wire types of the `/v1` routes not covered by `types.rs`: child topics (SPEC §3.7), users
//! and grants (§3.8) and cluster moves (§3.9). Request bodies are strict, like the server's.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `POST /v1/topics/{parent}/children` body: a local child (`child` + optional `delay_ms`) or a
/// remote link (`child` + `remote`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachChildRequest {
    pub child: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteTarget>,
}

/// The remote end of a remote child link (ext, SPEC §5.5). Credentials are write-only, and
/// `Debug` never shows them.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoteTarget {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for RemoteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |o: &Option<String>| o.as_ref().map(|_| "<redacted>");
        f.debug_struct("RemoteTarget")
            .field("url", &self.url)
            .field("topic", &self.topic)
            .field("username", &redacted(&self.username))
            .field("password", &redacted(&self.password))
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(String::len))
            .finish()
    }
}

/// `GET /v1/topics/{parent}/children` answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ChildList {
    pub parent: String,
    #[serde(default)]
    pub children: Vec<ChildInfo>,
}

/// One child in a [`ChildList`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ChildInfo {
    pub name: String,
    #[serde(default)]
    pub delay_ms: u64,
    #[serde(default)]
    pub lag_messages: u64,
    #[serde(default)]
    pub lag_complete: bool,
    /// `fanout`, `delay`, `replica` or `remote` (ext; empty from older servers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteInfo>,
    /// `ok`, `retrying` or `blocked` (remote links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The public part of a remote link (never credentials).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RemoteInfo {
    pub url: String,
    pub topic: String,
}

/// A grant: an action (`produce`, `consume`, `create`, `admin`) and topic-name patterns
/// (none for `admin`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub action: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// A user as the server returns it (hashes never returned).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct User {
    pub username: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub root: bool,
    #[serde(default)]
    pub created_at_ms: u64,
    #[serde(default)]
    pub updated_at_ms: u64,
    /// (ext) Absent when the user has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<Quotas>,
}

/// (ext) A user's quotas, the body of `PUT /v1/users/{u}/quotas` (which replaces them all:
/// an absent or null field is unlimited, `{}` lifts every quota). Rates are cluster-wide.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_msgs_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produce_bytes_per_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_topics: Option<u64>,
    /// Messages leased and not yet settled at once (each node its even share).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consume_in_flight: Option<u64>,
}

/// `POST /v1/users` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUserRequest {
    pub username: String,
    pub password: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
}

/// `PUT /v1/users/{u}/grants` body (replaces all grants). `grants` is required (`{}` is a
/// `400`; `{"grants":[]}` removes every grant).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutGrantsRequest {
    pub grants: Vec<Grant>,
}

/// `PUT /v1/users/{u}/password` body; `current_password` is needed only for one's own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_password: Option<String>,
    pub new_password: String,
}

/// `GET /v1/cluster/moves` answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MoveList {
    #[serde(default)]
    pub moves: Vec<MoveInfo>,
}

/// One partition move in flight.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MoveInfo {
    pub topic: String,
    pub partition: u32,
    pub from: String,
    pub to: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_credentials_never_in_debug_output() {
        let r = AttachChildRequest {
            child: "orders-dr".into(),
            delay_ms: None,
            remote: Some(RemoteTarget {
                url: "https://dr.example.com".into(),
                topic: Some("orders".into()),
                username: Some("replicator".into()),
                password: Some("s3cret-pw".into()),
                ca_pem: Some("-----BEGIN CERTIFICATE-----".into()),
            }),
        };
        let text = format!("{r:?}");
        assert!(
            !text.contains("s3cret-pw") && !text.contains("replicator"),
            "{text}"
        );
        assert!(text.contains("dr.example.com"), "{text}");
        // The wire form still carries them (write-only to the server).
        assert!(serde_json::to_string(&r).unwrap().contains("s3cret-pw"));
    }

    #[test]
    fn shapes() {
        let r = AttachChildRequest {
            child: "orders-retry".into(),
            delay_ms: Some(3_600_000),
            remote: None,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"child":"orders-retry","delay_ms":3600000}"#
        );
        let list: ChildList = serde_json::from_str(
            r#"{"parent":"orders","children":[
             {"name":"orders-retry","delay_ms":3600000,"lag_messages":5100,"lag_complete":true,"kind":"delay"},
             {"name":"orders-dr","delay_ms":0,"lag_messages":0,"lag_complete":false,"kind":"remote",
              "remote":{"url":"https://narad-dr.example.com","topic":"orders"},"state":"blocked","last_error":"401 authentication required"}]}"#,
        )
        .unwrap();
        assert_eq!(list.children.len(), 2);
        assert_eq!(list.children[1].remote.as_ref().unwrap().topic, "orders");
        let g = Grant {
            action: "admin".into(),
            patterns: vec![],
        };
        assert_eq!(serde_json::to_string(&g).unwrap(), r#"{"action":"admin"}"#);
        let u: User = serde_json::from_str(
            r#"{"username":"billing","grants":[{"action":"produce","patterns":["orders-*"]}],"root":true,"created_at_ms":1,"updated_at_ms":2}"#,
        )
        .unwrap();
        assert!(u.root);
        assert_eq!(u.grants[0].patterns, vec!["orders-*"]);
        let p = PasswordRequest {
            current_password: None,
            new_password: "x".into(),
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"new_password":"x"}"#
        );
        // `grants` is required: `{}` must not silently remove every grant.
        assert!(serde_json::from_str::<PutGrantsRequest>("{}").is_err());
        let empty: PutGrantsRequest = serde_json::from_str(r#"{"grants":[]}"#).unwrap();
        assert!(empty.grants.is_empty());
        assert_eq!(serde_json::to_string(&empty).unwrap(), r#"{"grants":[]}"#);
    }
}

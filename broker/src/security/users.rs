//! The `/v1/users` wire shapes (SPEC §3.8) ↔ the replicated records, and request validation.
//!
//! Reuses `narad_api::{User, Grant, CreateUserRequest, PutGrantsRequest, PasswordRequest}`.
//! The wire user never carries the hash; `grants` and `root` are omitted when empty / false
//! (the `narad_api` serde attributes do that).

use narad_api::{CreateUserRequest, PasswordRequest, PutGrantsRequest};
use narad_meta::{Action, Grant, User};

use super::authz::{validate_pattern, validate_username};
use super::password::validate_password;

/// The wire form of a user (no hash).
pub fn to_wire(u: &User) -> narad_api::User {
    narad_api::User {
        username: u.username.clone(),
        grants: u.grants.iter().map(grant_to_wire).collect(),
        root: u.root,
        created_at_ms: u.created_at_ms,
        updated_at_ms: u.updated_at_ms,
        quotas: (!u.quotas.is_none()).then_some(narad_api::Quotas {
            produce_msgs_per_s: u.quotas.produce_msgs_per_s,
            produce_bytes_per_s: u.quotas.produce_bytes_per_s,
            max_topics: u.quotas.max_topics,
            consume_in_flight: u.quotas.consume_in_flight,
        }),
    }
}

/// The most a quota may be: far above what a node does, far below overflow.
pub const MAX_QUOTA: u64 = 1 << 40;

/// Validates wire quotas (`400` messages): each given value 1 to 2^40.
pub fn quotas_from_wire(q: &narad_api::Quotas) -> Result<narad_meta::Quotas, String> {
    for (name, v) in [
        ("produce_msgs_per_s", q.produce_msgs_per_s),
        ("produce_bytes_per_s", q.produce_bytes_per_s),
        ("max_topics", q.max_topics),
        ("consume_in_flight", q.consume_in_flight),
    ] {
        if let Some(v) = v.filter(|v| !(1..=MAX_QUOTA).contains(v)) {
            return Err(format!(
                "{name} must be 1 to {MAX_QUOTA} (leave it out for no limit), got {v}"
            ));
        }
    }
    Ok(narad_meta::Quotas {
        produce_msgs_per_s: q.produce_msgs_per_s,
        produce_bytes_per_s: q.produce_bytes_per_s,
        max_topics: q.max_topics,
        consume_in_flight: q.consume_in_flight,
    })
}

/// The wire form of a grant.
pub fn grant_to_wire(g: &Grant) -> narad_api::Grant {
    narad_api::Grant {
        action: g.action.as_str().to_string(),
        patterns: g.patterns.clone(),
    }
}

/// Validates wire grants (`400` messages): known action, scoped grants with at least one
/// valid pattern, `admin` without patterns.
pub fn grants_from_wire(grants: &[narad_api::Grant]) -> Result<Vec<Grant>, String> {
    grants
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let action = Action::parse(&g.action).ok_or_else(|| {
                format!(
                    "grant {i}: unknown action {:?} (expected produce, consume, create or admin)",
                    g.action
                )
            })?;
            match action {
                Action::Admin if !g.patterns.is_empty() => {
                    return Err(format!("grant {i}: admin takes no patterns"));
                }
                Action::Admin => {}
                _ if g.patterns.is_empty() => {
                    return Err(format!(
                        "grant {i}: {action} needs at least one topic pattern"
                    ));
                }
                _ => {
                    for p in &g.patterns {
                        validate_pattern(p).map_err(|e| format!("grant {i}: {e}"))?;
                    }
                }
            }
            Ok(Grant {
                action,
                patterns: g.patterns.clone(),
            })
        })
        .collect()
}

/// `POST /v1/users` body → the grants to store (`400` messages): username, non-empty
/// password, grants.
pub fn validate_create(req: &CreateUserRequest) -> Result<Vec<Grant>, String> {
    validate_username(&req.username)?;
    validate_password(&req.password)?;
    grants_from_wire(&req.grants)
}

/// `PUT /v1/users/{u}/grants` body → the grants to store (`400` messages).
pub fn validate_put_grants(req: &PutGrantsRequest) -> Result<Vec<Grant>, String> {
    grants_from_wire(&req.grants)
}

/// `PUT /v1/users/{u}/password` body (`400`): the new password must not be empty.
pub fn validate_password_request(req: &PasswordRequest) -> Result<(), String> {
    validate_password(&req.new_password).map_err(|_| "new_password must not be empty".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(action: &str, patterns: &[&str]) -> narad_api::Grant {
        narad_api::Grant {
            action: action.into(),
            patterns: patterns.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn wire_user_shapes() {
        let u = User {
            username: "billing".into(),
            password_hash: "$argon2id$secret".into(),
            grants: vec![Grant {
                action: Action::Produce,
                patterns: vec!["orders-*".into()],
            }],
            root: false,
            created_at_ms: 1,
            updated_at_ms: 2,
            version: 9,
            quotas: Default::default(),
        };
        let json = serde_json::to_string(&to_wire(&u)).unwrap();
        assert_eq!(
            json,
            r#"{"username":"billing","grants":[{"action":"produce","patterns":["orders-*"]}],"created_at_ms":1,"updated_at_ms":2}"#
        );
        let bare = User {
            grants: vec![],
            ..u.clone()
        };
        assert_eq!(
            serde_json::to_string(&to_wire(&bare)).unwrap(),
            r#"{"username":"billing","created_at_ms":1,"updated_at_ms":2}"#
        );
        let root = User {
            username: "admin".into(),
            grants: vec![Grant {
                action: Action::Admin,
                patterns: vec![],
            }],
            root: true,
            ..u
        };
        let json = serde_json::to_string(&to_wire(&root)).unwrap();
        assert_eq!(
            json,
            r#"{"username":"admin","grants":[{"action":"admin"}],"root":true,"created_at_ms":1,"updated_at_ms":2}"#
        );
        assert!(!json.contains("argon2"));
    }

    #[test]
    fn grant_validation() {
        let ok = grants_from_wire(&[
            wire("produce", &["orders-*", "x"]),
            wire("consume", &["*"]),
            wire("create", &["orders"]),
            wire("admin", &[]),
        ])
        .unwrap();
        assert_eq!(
            ok.iter().map(|g| g.action).collect::<Vec<_>>(),
            [
                Action::Produce,
                Action::Consume,
                Action::Create,
                Action::Admin
            ]
        );
        assert_eq!(grants_from_wire(&[]).unwrap(), vec![]);
        for (bad, msg) in [
            (wire("publish", &["x"]), "unknown action"),
            (wire("Produce", &["x"]), "unknown action"),
            (wire("", &["x"]), "unknown action"),
            (wire("produce", &[]), "needs at least one topic pattern"),
            (wire("consume", &["bad pattern"]), "invalid pattern"),
            (wire("create", &["a*b"]), "invalid pattern"),
            (wire("create", &[""]), "invalid pattern"),
            (wire("admin", &["*"]), "admin takes no patterns"),
        ] {
            let e = grants_from_wire(&[wire("produce", &["ok"]), bad.clone()]).unwrap_err();
            assert!(
                e.starts_with("grant 1: ") && e.contains(msg),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn create_request_validation() {
        let req = |u: &str, p: &str| CreateUserRequest {
            username: u.into(),
            password: p.into(),
            grants: vec![wire("produce", &["orders-*"])],
        };
        assert_eq!(validate_create(&req("billing", "pw")).unwrap().len(), 1);
        assert!(validate_create(&req("bil ling", "pw"))
            .unwrap_err()
            .contains("invalid username"));
        assert!(validate_create(&req(&"u".repeat(65), "pw")).is_err());
        assert!(validate_create(&req("billing", ""))
            .unwrap_err()
            .contains("password must not be empty"));
        // Strict body: unknown fields are refused by serde (400 in the handler).
        assert!(serde_json::from_str::<CreateUserRequest>(
            r#"{"username":"u","password":"p","root":true}"#
        )
        .is_err());
    }

    #[test]
    fn grants_and_password_requests() {
        assert!(validate_put_grants(&PutGrantsRequest {
            grants: vec![wire("admin", &[])]
        })
        .is_ok());
        assert!(validate_put_grants(&PutGrantsRequest {
            grants: vec![wire("admin", &["x"])]
        })
        .is_err());
        assert!(validate_password_request(&PasswordRequest {
            current_password: None,
            new_password: "n".into()
        })
        .is_ok());
        assert_eq!(
            validate_password_request(&PasswordRequest {
                current_password: Some("c".into()),
                new_password: String::new()
            })
            .unwrap_err(),
            "new_password must not be empty"
        );
    }
}

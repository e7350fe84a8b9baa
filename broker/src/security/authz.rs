//! Authorization (SPEC §4.2, §4.3): pure decisions, one function per route category.
//!
//! Every decision is a [`Decision`] = `Result<(), Denied>`: `Ok` to proceed, or the exact
//! SPEC answer, [`Denied::Forbidden`] (`403`) or [`Denied::NotFound`] (`404`), in the order
//! the SPEC prescribes (see each function). `Denied` converts into `ApiError` with `?`.
//!
//! Topic functions take the topic as the handler found it in the local view
//! (`Option<&Topic>`: `None` = missing), so existence and permission are decided together
//! and in the right order; a handler that catches up before answering `404` (SPEC §6.1) can
//! do so on `Denied::NotFound` and ask again. With [`Caller::SecurityOff`] only existence is
//! checked.
//!
//! Ownership grants topic management (alter, delete, attach, detach), not produce or consume:
//! those need their grant even for the owner (SPEC §4.2 lists exactly what the owner may do).
//! Pattern matching is case-sensitive.

use narad_meta::{Action, Grant, Topic, User};

use super::{Caller, Principal};

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// `403`: authenticated but not allowed.
    Forbidden(String),
    /// `404`: the topic or user does not exist (and the caller may know that).
    NotFound(String),
}

impl Denied {
    pub fn status(&self) -> u16 {
        match self {
            Denied::Forbidden(_) => 403,
            Denied::NotFound(_) => 404,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Denied::Forbidden(m) | Denied::NotFound(m) => m,
        }
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status(), self.message())
    }
}

impl std::error::Error for Denied {}

/// `Ok(())` to proceed, or the refusal to answer.
pub type Decision = Result<(), Denied>;

/// Longest username (SPEC §11).
pub const MAX_USERNAME_LEN: usize = 64;
/// Longest pattern before the optional trailing `*` (SPEC §11).
pub const MAX_PATTERN_PREFIX_LEN: usize = 255;

fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// `^[A-Za-z0-9._-]{1,64}$` (`400` otherwise).
pub fn validate_username(username: &str) -> Result<(), String> {
    if username.is_empty()
        || username.len() > MAX_USERNAME_LEN
        || !username.bytes().all(name_byte)
        || username == "."
        || username == ".."
    {
        return Err(format!(
            "invalid username {username:?}: 1 to {MAX_USERNAME_LEN} of [A-Za-z0-9._-], not . or .."
        ));
    }
    Ok(())
}

/// `^[A-Za-z0-9._-]{0,255}\*?$`, non-empty (`400` otherwise).
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    let prefix = pattern.strip_suffix('*').unwrap_or(pattern);
    if pattern.is_empty() || prefix.len() > MAX_PATTERN_PREFIX_LEN || !prefix.bytes().all(name_byte)
    {
        return Err(format!(
            "invalid pattern {pattern:?}: an exact topic name or a prefix ending in one *, \
             up to {MAX_PATTERN_PREFIX_LEN} of [A-Za-z0-9._-] before it"
        ));
    }
    Ok(())
}

/// Whether `pattern` matches topic `name`: an exact name, or a prefix with one trailing `*`
/// (`orders-*` matches `orders-` and `orders-x`, not `orders` nor `ordersx`; `*` matches all).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether `p` may do `action` on topic `topic` owned by `owner`: admin may do everything;
/// `Action::Admin` on a topic means managing it (alter, delete, attach, detach), allowed to
/// its owner; the scoped actions need a grant whose pattern matches.
pub fn can(p: &Principal, action: Action, topic: &str, owner: Option<&str>) -> bool {
    if p.is_admin() {
        return true;
    }
    match action {
        Action::Admin => owner == Some(p.username.as_str()),
        scoped => p.holds(scoped, topic),
    }
}

fn owns(p: &Principal, t: &Topic) -> bool {
    t.owner.as_deref() == Some(p.username.as_str())
}

/// Whether the caller sees `topic` (SPEC §4.3): admin, owner, or any grant pattern matching
/// its name. For filtering `GET /v1/topics`.
pub fn visible(caller: &Caller, topic: &Topic) -> bool {
    match caller {
        Caller::SecurityOff => true,
        Caller::User(p) => p.is_admin() || owns(p, topic) || p.any_pattern_matches(&topic.name),
    }
}

fn topic_not_found(name: &str) -> Denied {
    Denied::NotFound(format!("topic {name} not found"))
}

fn exists<'a>(name: &str, topic: Option<&'a Topic>) -> Result<&'a Topic, Denied> {
    topic.ok_or_else(|| topic_not_found(name))
}

fn not_owner(p: &Principal, name: &str) -> Denied {
    Denied::Forbidden(format!(
        "user {} is neither the owner of topic {name} nor an admin",
        p.username
    ))
}

/// `POST /v1/topics/{t}/produce[/batch]`: the `produce` grant (`403`, whether or not the
/// topic exists), then existence (`404`).
pub fn produce(caller: &Caller, name: &str, topic: Option<&Topic>) -> Decision {
    if let Caller::User(p) = caller {
        if !p.holds(Action::Produce, name) {
            return Err(Denied::Forbidden(format!(
                "user {} may not produce to topic {name}",
                p.username
            )));
        }
    }
    exists(name, topic).map(drop)
}

/// Consume, replay, ack, extend, nack (single and batch): the `consume` grant (`403`), then
/// existence (`404`).
pub fn consume(caller: &Caller, name: &str, topic: Option<&Topic>) -> Decision {
    if let Caller::User(p) = caller {
        if !p.holds(Action::Consume, name) {
            return Err(Denied::Forbidden(format!(
                "user {} may not consume from topic {name}",
                p.username
            )));
        }
    }
    exists(name, topic).map(drop)
}

/// `POST /v1/topics`: the `create` grant on `name` (`403`); with a parent
/// (`Some((parent_name, parent_topic))`) also: parent exists (`404`), then the caller owns it
/// or is admin (`403`). Whether `name` is taken (`409`) is the handler's business.
pub fn create(caller: &Caller, name: &str, parent: Option<(&str, Option<&Topic>)>) -> Decision {
    if let Caller::User(p) = caller {
        if !p.holds(Action::Create, name) {
            return Err(Denied::Forbidden(format!(
                "user {} may not create topic {name}",
                p.username
            )));
        }
    }
    if let Some((parent_name, parent)) = parent {
        let parent = exists(parent_name, parent)?;
        if let Caller::User(p) = caller {
            if !p.is_admin() && !owns(p, parent) {
                return Err(not_owner(p, parent_name));
            }
        }
    }
    Ok(())
}

/// `PATCH` / `DELETE /v1/topics/{t}` and `DELETE /v1/topics/{parent}/children/{child}` (on
/// the parent): existence (`404`), then owner or admin (`403`). The detach's own
/// `404 not attached` follows in the handler.
pub fn manage(caller: &Caller, name: &str, topic: Option<&Topic>) -> Decision {
    let topic = exists(name, topic)?;
    if let Caller::User(p) = caller {
        if !p.is_admin() && !owns(p, topic) {
            return Err(not_owner(p, name));
        }
    }
    Ok(())
}

/// The child of an attach.
#[derive(Debug, Clone, Copy)]
pub enum ChildRef<'a> {
    /// A local topic (`None` = missing).
    Local {
        name: &'a str,
        topic: Option<&'a Topic>,
    },
    /// A remote link (ext, SPEC §5.5): nothing local to own.
    Remote,
}

/// `POST /v1/topics/{parent}/children`: parent and local child exist (`404`), then the caller
/// owns (or is admin of) the parent and the local child (`403`) (SPEC §4.2 ext: both).
pub fn attach(
    caller: &Caller,
    parent_name: &str,
    parent: Option<&Topic>,
    child: ChildRef<'_>,
) -> Decision {
    let parent = exists(parent_name, parent)?;
    let child = match child {
        ChildRef::Local { name, topic } => Some((name, exists(name, topic)?)),
        ChildRef::Remote => None,
    };
    if let Caller::User(p) = caller {
        if !p.is_admin() {
            if !owns(p, parent) {
                return Err(not_owner(p, parent_name));
            }
            if let Some((child_name, child)) = child {
                if !owns(p, child) {
                    return Err(not_owner(p, child_name));
                }
            }
        }
    }
    Ok(())
}

/// A remote child link (SPEC §5.5, after [`attach`]): where this node has no
/// `remotes.allowed_hosts`, only an admin may point the broker at a URL (`403`).
pub fn attach_remote(caller: &Caller, allow_list_configured: bool) -> Decision {
    if let Caller::User(p) = caller {
        if !allow_list_configured && !p.is_admin() {
            return Err(Denied::Forbidden(format!(
                "user {} may not attach a remote child: without remotes.allowed_hosts only an admin may",
                p.username
            )));
        }
    }
    Ok(())
}

/// Whether the caller may read the details of a topic's remote links (`last_error`, which
/// can hold what a remote answered): the owner and admins.
pub fn sees_link_errors(caller: &Caller, topic: &Topic) -> bool {
    match caller {
        Caller::User(p) => p.is_admin() || owns(p, topic),
        _ => true,
    }
}

/// `GET /v1/topics/{t}` and `GET /v1/topics/{t}/children`: not visible → `403` whether or not
/// the topic exists (names do not leak); visible and missing → `404`. A missing topic is
/// visible to admins and to callers with a grant pattern matching the name.
pub fn view(caller: &Caller, name: &str, topic: Option<&Topic>) -> Decision {
    if let Caller::User(p) = caller {
        let seen = p.is_admin() || p.any_pattern_matches(name) || topic.is_some_and(|t| owns(p, t));
        if !seen {
            return Err(Denied::Forbidden(format!(
                "user {} may not see topic {name}",
                p.username
            )));
        }
    }
    exists(name, topic).map(drop)
}

/// `GET /v1/cluster/*`: any authenticated user (authentication already happened).
pub fn cluster_read(_caller: &Caller) -> Decision {
    Ok(())
}

/// `POST|DELETE /v1/cluster/members/{id}/decommission`: admin.
pub fn cluster_admin(caller: &Caller) -> Decision {
    require_admin(caller, "cluster operations need the admin grant")
}

fn require_admin(caller: &Caller, what: &str) -> Decision {
    match caller {
        Caller::User(p) if !p.is_admin() => {
            Err(Denied::Forbidden(format!("user {}: {what}", p.username)))
        }
        _ => Ok(()),
    }
}

/// `GET /v1/users`, `GET /v1/users/{u}`, and the first check of every user change: admin
/// (`403` before anything else, so user names do not leak).
pub fn user_admin(caller: &Caller) -> Decision {
    require_admin(caller, "user management needs the admin grant")
}

fn user_not_found(name: &str) -> Denied {
    Denied::NotFound(format!("user {name} not found"))
}

fn grants_admin(grants: &[Grant]) -> bool {
    grants.iter().any(|g| g.action == Action::Admin)
}

fn admin_grant_check(caller: &Caller, grants: &[Grant]) -> Decision {
    if let Caller::User(p) = caller {
        if grants_admin(grants) && !p.root {
            return Err(Denied::Forbidden(
                "only the root user may grant admin".into(),
            ));
        }
    }
    Ok(())
}

/// `POST /v1/users` (after the body validated, `400`): admin (`403`); granting `admin` needs
/// root (`403`). A taken name (`409`) is refused by the state machine.
pub fn create_user(caller: &Caller, grants: &[Grant]) -> Decision {
    user_admin(caller)?;
    admin_grant_check(caller, grants)
}

/// `PUT /v1/users/{u}/grants`: admin (`403`), user exists (`404`), root's grants are fixed,
/// nobody changes their own grants, only root grants `admin` (`403`).
pub fn set_grants(
    caller: &Caller,
    target_name: &str,
    target: Option<&User>,
    grants: &[Grant],
) -> Decision {
    user_admin(caller)?;
    let target = target.ok_or_else(|| user_not_found(target_name))?;
    if target.root {
        return Err(Denied::Forbidden(format!(
            "the grants of root user {target_name} are fixed"
        )));
    }
    if let Caller::User(p) = caller {
        if p.username == target.username {
            return Err(Denied::Forbidden(
                "you cannot change your own grants".into(),
            ));
        }
    }
    admin_grant_check(caller, grants)
}

/// (ext) `PUT /v1/users/{u}/quotas`: admin (`403`), user exists (`404`); root has none,
/// nobody changes their own, and only root sets an admin's (`403`).
pub fn set_quotas(caller: &Caller, target_name: &str, target: Option<&User>) -> Decision {
    user_admin(caller)?;
    let target = target.ok_or_else(|| user_not_found(target_name))?;
    if target.root {
        return Err(Denied::Forbidden(format!(
            "root user {target_name} has no quotas"
        )));
    }
    if let Caller::User(p) = caller {
        if p.username == target.username {
            return Err(Denied::Forbidden(
                "you cannot change your own quotas".into(),
            ));
        }
        if target.is_admin() && !p.root {
            return Err(Denied::Forbidden(format!(
                "only root sets the quotas of admin {target_name}"
            )));
        }
    }
    Ok(())
}

/// `DELETE /v1/users/{u}`: admin (`403`), user exists (`404`), root cannot be deleted and
/// nobody deletes themselves (`403`).
pub fn delete_user(caller: &Caller, target_name: &str, target: Option<&User>) -> Decision {
    user_admin(caller)?;
    let target = target.ok_or_else(|| user_not_found(target_name))?;
    if target.root {
        return Err(Denied::Forbidden(format!(
            "root user {target_name} cannot be deleted"
        )));
    }
    if let Caller::User(p) = caller {
        if p.username == target.username {
            return Err(Denied::Forbidden("you cannot delete yourself".into()));
        }
    }
    Ok(())
}

/// What a permitted password change still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordChange {
    /// Set the new password (an admin reset, or security off).
    Reset,
    /// The caller changes their own password: `current_password` must verify against the
    /// target's hash first (`Authenticator::verify_current_password`, throttled; wrong → `403`).
    VerifyCurrent,
}

/// `PUT /v1/users/{u}/password` (SPEC §4.2):
/// - one's own password (root included) needs `current_password` (missing → `403`; its
///   verification is the caller's next step, see [`PasswordChange::VerifyCurrent`]);
/// - an admin resets any other non-root password without it (a given one is ignored);
/// - only root changes root's password; anyone else changing another's password → `403`;
/// - a missing target is `404` for admins and for oneself, `403` for others (no leak).
///
/// With security off everything is allowed (a missing user is still `404`).
pub fn change_password(
    caller: &Caller,
    target_name: &str,
    target: Option<&User>,
    current_password: Option<&str>,
) -> Result<PasswordChange, Denied> {
    let p = match caller {
        Caller::SecurityOff => {
            target.ok_or_else(|| user_not_found(target_name))?;
            return Ok(PasswordChange::Reset);
        }
        Caller::User(p) => p,
    };
    if p.username == target_name {
        target.ok_or_else(|| user_not_found(target_name))?;
        return match current_password {
            Some(c) if !c.is_empty() => Ok(PasswordChange::VerifyCurrent),
            _ => Err(Denied::Forbidden(
                "current_password is required to change your own password".into(),
            )),
        };
    }
    if !p.is_admin() {
        return Err(Denied::Forbidden(format!(
            "user {} may only change their own password",
            p.username
        )));
    }
    let target = target.ok_or_else(|| user_not_found(target_name))?;
    if target.root && !p.root {
        return Err(Denied::Forbidden(
            "only root changes root's password".into(),
        ));
    }
    Ok(PasswordChange::Reset)
}

/// The answer to a wrong `current_password`.
pub fn wrong_current_password() -> Denied {
    Denied::Forbidden("current_password is wrong".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_meta::TopicConfig;

    // ---- fixtures -------------------------------------------------------------------------

    fn g(action: Action, patterns: &[&str]) -> Grant {
        Grant {
            action,
            patterns: patterns.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn principal(name: &str, root: bool, grants: Vec<Grant>) -> Caller {
        Caller::User(Principal {
            username: name.into(),
            root,
            grants,
            quotas: Default::default(),
        })
    }

    fn topic(name: &str, owner: Option<&str>) -> Topic {
        Topic {
            id: 1,
            name: name.into(),
            config: TopicConfig {
                partitions: 3,
                retention_ms: 0,
                visibility_timeout_ms: 30_000,
                max_in_flight_per_partition: 1024,
                max_acked_ahead_per_partition: 1024,
                retry_backoff: None,
                dead_letter: None,
                dedup_window_ms: None,
            },
            created_at_ms: 1,
            owner: owner.map(str::to_string),
            schemas: vec![],
            assignments: vec![],
            paused: false,
        }
    }

    fn user(name: &str, root: bool, grants: Vec<Grant>) -> User {
        User {
            username: name.into(),
            password_hash: String::new(),
            grants,
            root,
            created_at_ms: 1,
            updated_at_ms: 1,
            version: 0,
            quotas: Default::default(),
        }
    }

    /// The callers of the tables. "nogrant" holds grants, just not the one needed (and
    /// patterns that do not match `orders`); "granted" holds all scoped actions on `orders*`;
    /// "owner" owns `orders` and `orders-child` but holds no grant at all.
    fn callers() -> Vec<(&'static str, Caller)> {
        vec![
            ("off", Caller::SecurityOff),
            (
                "nogrant",
                principal("nogrant", false, vec![g(Action::Produce, &["payments-*"])]),
            ),
            (
                "granted",
                principal(
                    "granted",
                    false,
                    vec![
                        g(Action::Produce, &["orders*"]),
                        g(Action::Consume, &["orders*"]),
                        g(Action::Create, &["orders*"]),
                    ],
                ),
            ),
            ("owner", principal("owner", false, vec![])),
            (
                "admin",
                principal("admin2", false, vec![g(Action::Admin, &[])]),
            ),
            (
                "root",
                principal("admin", true, vec![g(Action::Admin, &[])]),
            ),
        ]
    }

    /// Runs `f` for every caller against an existing topic (`orders`, owned by `owner`) and a
    /// missing one, and compares the statuses (200 = allowed) with `expected`:
    /// `(caller, status when the topic exists, status when missing)`.
    fn table(
        what: &str,
        f: impl Fn(&Caller, &str, Option<&Topic>) -> Decision,
        expected: &[(&str, u16, u16)],
    ) {
        let t = topic("orders", Some("owner"));
        let all = callers();
        assert_eq!(expected.len(), all.len(), "{what}: one row per caller");
        for ((name, caller), (ename, on_existing, on_missing)) in all.iter().zip(expected) {
            assert_eq!(name, ename);
            let status = |d: Decision| d.map_or_else(|e| e.status(), |_| 200);
            assert_eq!(
                status(f(caller, "orders", Some(&t))),
                *on_existing,
                "{what} by {name} on an existing topic"
            );
            assert_eq!(
                status(f(caller, "orders", None)),
                *on_missing,
                "{what} by {name} on a missing topic"
            );
        }
    }

    // ---- patterns and names ---------------------------------------------------------------

    #[test]
    fn pattern_matching() {
        for (pattern, name, want) in [
            ("orders", "orders", true),
            ("orders", "orders-x", false),
            ("orders", "Orders", false),
            ("orders-*", "orders-x", true),
            ("orders-*", "orders-", true),
            ("orders-*", "orders", false),
            ("orders-*", "ordersx", false),
            ("orders-*", "xorders-x", false),
            ("orders*", "orders", true),
            ("orders*", "ordersx", true),
            ("*", "anything", true),
            ("*", "a", true),
            ("o", "orders", false),
        ] {
            assert_eq!(pattern_matches(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn pattern_validation() {
        let long_ok = "a".repeat(255);
        let long_bad = "a".repeat(256);
        for (p, ok) in [
            ("orders", true),
            ("orders-*", true),
            ("*", true),
            ("a.b_c-D9", true),
            (long_ok.as_str(), true),
            (&format!("{long_ok}*"), true),
            (long_bad.as_str(), false),
            (&format!("{long_bad}*"), false),
            ("", false),
            ("**", false),
            ("a*b", false),
            ("*a", false),
            ("or ders", false),
            ("orders/x", false),
            ("é", false),
        ] {
            assert_eq!(validate_pattern(p).is_ok(), ok, "{p:?}");
        }
    }

    #[test]
    fn username_validation() {
        let max = "u".repeat(64);
        let over = "u".repeat(65);
        for (u, ok) in [
            ("billing", true),
            ("a", true),
            ("A.b_c-9", true),
            (max.as_str(), true),
            (over.as_str(), false),
            ("", false),
            ("bil ling", false),
            ("bil:ling", false),
            ("bil*", false),
            ("ü", false),
            (".", false),
            ("..", false),
            ("...", true),
            (".a", true),
        ] {
            assert_eq!(validate_username(u).is_ok(), ok, "{u:?}");
        }
    }

    #[test]
    fn can_table() {
        let p = |grants| Principal {
            username: "u".into(),
            root: false,
            grants,
            quotas: Default::default(),
        };
        let producer = p(vec![g(Action::Produce, &["orders-*"])]);
        assert!(can(&producer, Action::Produce, "orders-x", None));
        assert!(can(&producer, Action::Produce, "orders-", None));
        assert!(!can(&producer, Action::Produce, "orders", None));
        assert!(!can(&producer, Action::Produce, "ordersx", None));
        assert!(!can(&producer, Action::Consume, "orders-x", None));
        assert!(!can(&producer, Action::Create, "orders-x", None));
        // Topic-level admin = owner.
        assert!(can(&producer, Action::Admin, "orders-x", Some("u")));
        assert!(!can(&producer, Action::Admin, "orders-x", Some("v")));
        assert!(!can(&producer, Action::Admin, "orders-x", None));
        // Owner does not imply produce or consume.
        assert!(!can(&p(vec![]), Action::Produce, "t", Some("u")));
        let admin = p(vec![g(Action::Admin, &[])]);
        for a in [
            Action::Produce,
            Action::Consume,
            Action::Create,
            Action::Admin,
        ] {
            assert!(can(&admin, a, "anything", Some("someone-else")));
        }
        let root = Principal {
            username: "admin".into(),
            root: true,
            grants: vec![],
            quotas: Default::default(),
        };
        assert!(can(&root, Action::Produce, "x", None));
        let star = p(vec![g(Action::Consume, &["*"])]);
        assert!(can(&star, Action::Consume, "anything", None));
        assert!(!can(&star, Action::Produce, "anything", None));
    }

    // ---- topic routes ---------------------------------------------------------------------

    #[test]
    fn produce_table() {
        table(
            "produce",
            produce,
            &[
                ("off", 200, 404),
                ("nogrant", 403, 403),
                ("granted", 200, 404),
                ("owner", 403, 403),
                ("admin", 200, 404),
                ("root", 200, 404),
            ],
        );
    }

    #[test]
    fn consume_table() {
        // consume, replay, ack, extend, nack
        table(
            "consume",
            consume,
            &[
                ("off", 200, 404),
                ("nogrant", 403, 403),
                ("granted", 200, 404),
                ("owner", 403, 403),
                ("admin", 200, 404),
                ("root", 200, 404),
            ],
        );
    }

    #[test]
    fn manage_table() {
        // alter, delete, detach: 404 for a missing topic first, then 403 for non-owners.
        table(
            "alter/delete/detach",
            manage,
            &[
                ("off", 200, 404),
                ("nogrant", 403, 404),
                ("granted", 403, 404),
                ("owner", 200, 404),
                ("admin", 200, 404),
                ("root", 200, 404),
            ],
        );
    }

    #[test]
    fn view_table() {
        // get topic / get children: invisible → 403 whether or not it exists.
        table(
            "view",
            view,
            &[
                ("off", 200, 404),
                ("nogrant", 403, 403),
                ("granted", 200, 404),
                ("owner", 200, 403), // a missing topic has no owner
                ("admin", 200, 404),
                ("root", 200, 404),
            ],
        );
        // Any grant's pattern gives visibility, whatever its action.
        let c = principal("c", false, vec![g(Action::Create, &["orders"])]);
        assert_eq!(view(&c, "orders", None).unwrap_err().status(), 404);
        assert!(view(&c, "orders", Some(&topic("orders", None))).is_ok());
        assert_eq!(
            view(&c, "ordersx", Some(&topic("ordersx", None)))
                .unwrap_err()
                .status(),
            403
        );
    }

    #[test]
    fn create_table() {
        table(
            "create",
            |c, name, _| create(c, name, None),
            &[
                ("off", 200, 200),
                ("nogrant", 403, 403),
                ("granted", 200, 200),
                ("owner", 403, 403),
                ("admin", 200, 200),
                ("root", 200, 200),
            ],
        );
        // With a parent: `create` on the name, then the parent exists (404), then owner or
        // admin of the parent (403). Here the third column is "parent missing".
        table(
            "create with parent",
            |c, _, parent| create(c, "orders-replica", Some(("orders", parent))),
            &[
                ("off", 200, 404),
                ("nogrant", 403, 403),
                ("granted", 403, 404), // holds create, does not own the parent
                ("owner", 403, 403),   // owns the parent, lacks create on the name
                ("admin", 200, 404),
                ("root", 200, 404),
            ],
        );
        let owner_creator = principal("owner", false, vec![g(Action::Create, &["orders-*"])]);
        let parent = topic("orders", Some("owner"));
        assert!(create(&owner_creator, "orders-r", Some(("orders", Some(&parent)))).is_ok());
        assert_eq!(
            create(&owner_creator, "orders", None).unwrap_err().status(),
            403,
            "orders-* does not cover orders"
        );
    }

    #[test]
    fn attach_rules() {
        let parent = topic("orders", Some("owner"));
        let child_owned = topic("orders-audit", Some("owner"));
        let child_other = topic("orders-other", Some("someone"));
        let owner = principal("owner", false, vec![]);
        let admin = principal("a", false, vec![g(Action::Admin, &[])]);
        let granted = principal("granted", false, vec![g(Action::Create, &["*"])]);
        let local = |name, t| ChildRef::Local { name, topic: t };
        let st = |d: Decision| d.map_or_else(|e| e.status(), |_| 200);

        assert_eq!(
            st(attach(
                &owner,
                "orders",
                Some(&parent),
                local("orders-audit", Some(&child_owned))
            )),
            200
        );
        assert_eq!(
            st(attach(&owner, "orders", Some(&parent), ChildRef::Remote)),
            200
        );
        // ext: ownership of the child too.
        let d = attach(
            &owner,
            "orders",
            Some(&parent),
            local("orders-other", Some(&child_other)),
        );
        assert_eq!(d.as_ref().unwrap_err().status(), 403);
        assert!(d.unwrap_err().message().contains("orders-other"));
        // Missing parent or child: 404 before any 403.
        assert_eq!(st(attach(&granted, "orders", None, ChildRef::Remote)), 404);
        assert_eq!(
            st(attach(
                &granted,
                "orders",
                Some(&parent),
                local("nope", None)
            )),
            404
        );
        assert_eq!(
            st(attach(&owner, "orders", Some(&parent), local("nope", None))),
            404
        );
        // Non-owner of the parent.
        assert_eq!(
            st(attach(
                &granted,
                "orders",
                Some(&parent),
                local("orders-audit", Some(&child_owned))
            )),
            403
        );
        assert_eq!(
            st(attach(&granted, "orders", Some(&parent), ChildRef::Remote)),
            403
        );
        // Admin and security off.
        assert_eq!(
            st(attach(
                &admin,
                "orders",
                Some(&parent),
                local("orders-other", Some(&child_other))
            )),
            200
        );
        assert_eq!(
            st(attach(
                &Caller::SecurityOff,
                "orders",
                Some(&parent),
                local("orders-other", Some(&child_other))
            )),
            200
        );
        assert_eq!(
            st(attach(
                &Caller::SecurityOff,
                "orders",
                None,
                ChildRef::Remote
            )),
            404
        );
    }

    #[test]
    fn list_shows_visible_topics_only() {
        let topics = [
            topic("orders", Some("owner")),
            topic("orders-x", None),
            topic("payments", Some("nogrant")),
            topic("secret", Some("someone")),
        ];
        let names = |c: &Caller| -> Vec<&str> {
            topics
                .iter()
                .filter(|t| visible(c, t))
                .map(|t| t.name.as_str())
                .collect()
        };
        let all = callers();
        let by = |n: &str| all.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(
            names(&by("off")),
            ["orders", "orders-x", "payments", "secret"]
        );
        assert_eq!(
            names(&by("admin")),
            ["orders", "orders-x", "payments", "secret"]
        );
        assert_eq!(names(&by("granted")), ["orders", "orders-x"]);
        assert_eq!(names(&by("owner")), ["orders"]);
        // "nogrant" owns payments; its payments-* pattern does not match "payments".
        assert_eq!(names(&by("nogrant")), ["payments"]);
    }

    #[test]
    fn cluster_routes() {
        for (name, c) in callers() {
            assert!(cluster_read(&c).is_ok(), "{name}");
            let admin_ok = matches!(name, "off" | "admin" | "root");
            assert_eq!(cluster_admin(&c).is_ok(), admin_ok, "{name}");
            if !admin_ok {
                assert_eq!(cluster_admin(&c).unwrap_err().status(), 403);
            }
        }
    }

    // ---- users ----------------------------------------------------------------------------

    fn st<T>(r: Result<T, Denied>) -> u16 {
        r.map_or_else(|e| e.status(), |_| 200)
    }

    #[test]
    fn quotas_rules() {
        let billing = user("billing", false, vec![g(Action::Produce, &["x"])]);
        let ops = user("ops", false, vec![g(Action::Admin, &[])]);
        let root_user = user("admin", true, vec![]);
        let root = principal("admin", true, vec![]);
        let admin = principal("ops2", false, vec![g(Action::Admin, &[])]);
        let producer = principal("p", false, vec![g(Action::Produce, &["*"])]);
        assert_eq!(st(set_quotas(&admin, "billing", Some(&billing))), 200);
        assert_eq!(st(set_quotas(&root, "billing", Some(&billing))), 200);
        assert_eq!(
            st(set_quotas(&Caller::SecurityOff, "billing", Some(&billing))),
            200
        );
        assert_eq!(st(set_quotas(&producer, "billing", Some(&billing))), 403);
        assert_eq!(st(set_quotas(&admin, "nobody", None)), 404);
        assert_eq!(
            st(set_quotas(&producer, "nobody", None)),
            403,
            "no name leaks"
        );
        assert_eq!(st(set_quotas(&root, "admin", Some(&root_user))), 403);
        // Only root limits an admin; nobody lifts their own.
        assert_eq!(st(set_quotas(&admin, "ops", Some(&ops))), 403);
        assert_eq!(st(set_quotas(&root, "ops", Some(&ops))), 200);
        let own = principal("ops", false, vec![g(Action::Admin, &[])]);
        assert_eq!(st(set_quotas(&own, "ops", Some(&ops))), 403);
    }

    #[test]
    fn user_management_needs_admin() {
        let billing = user("billing", false, vec![g(Action::Produce, &["x"])]);
        for (name, c) in callers() {
            let admin_ok = matches!(name, "off" | "admin" | "root");
            let want = if admin_ok { 200 } else { 403 };
            assert_eq!(st(user_admin(&c)), want, "list/get by {name}");
            assert_eq!(st(create_user(&c, &[])), want, "create by {name}");
            assert_eq!(
                st(create_user(&c, &[g(Action::Consume, &["*"])])),
                want,
                "create scoped by {name}"
            );
            assert_eq!(
                st(set_grants(&c, "billing", Some(&billing), &[])),
                want,
                "grants by {name}"
            );
            assert_eq!(
                st(delete_user(&c, "billing", Some(&billing))),
                want,
                "delete by {name}"
            );
            // Non-admins get 403 even for missing users (no leak); admins 404.
            let missing = if admin_ok { 404 } else { 403 };
            assert_eq!(st(set_grants(&c, "ghost", None, &[])), missing, "{name}");
            assert_eq!(st(delete_user(&c, "ghost", None)), missing, "{name}");
        }
    }

    #[test]
    fn escalation_attempts() {
        let admin2 = principal("admin2", false, vec![g(Action::Admin, &[])]);
        let root = principal("admin", true, vec![g(Action::Admin, &[])]);
        let root_user = user("admin", true, vec![g(Action::Admin, &[])]);
        let admin2_user = user("admin2", false, vec![g(Action::Admin, &[])]);
        let billing = user("billing", false, vec![]);
        let admin_grant = [g(Action::Admin, &[])];
        let scoped = [g(Action::Produce, &["*"]), g(Action::Create, &["*"])];

        // Only root grants admin, at creation or later.
        assert_eq!(st(create_user(&admin2, &admin_grant)), 403);
        assert_eq!(st(create_user(&admin2, &scoped)), 200);
        assert_eq!(st(create_user(&root, &admin_grant)), 200);
        assert_eq!(
            st(set_grants(&admin2, "billing", Some(&billing), &admin_grant)),
            403
        );
        assert_eq!(
            st(set_grants(&admin2, "billing", Some(&billing), &scoped)),
            200
        );
        assert_eq!(
            st(set_grants(&root, "billing", Some(&billing), &admin_grant)),
            200
        );
        // Nobody changes their own grants (not even to drop some).
        assert_eq!(
            st(set_grants(&admin2, "admin2", Some(&admin2_user), &[])),
            403
        );
        assert_eq!(
            st(set_grants(
                &admin2,
                "admin2",
                Some(&admin2_user),
                &admin_grant
            )),
            403
        );
        // Root's grants are fixed, for root too and with security off.
        assert_eq!(
            st(set_grants(&admin2, "admin", Some(&root_user), &scoped)),
            403
        );
        assert_eq!(
            st(set_grants(&root, "admin", Some(&root_user), &admin_grant)),
            403
        );
        assert_eq!(
            st(set_grants(
                &Caller::SecurityOff,
                "admin",
                Some(&root_user),
                &[]
            )),
            403
        );
        // Root cannot be deleted; nobody deletes themselves.
        assert_eq!(st(delete_user(&admin2, "admin", Some(&root_user))), 403);
        assert_eq!(st(delete_user(&root, "admin", Some(&root_user))), 403);
        assert_eq!(
            st(delete_user(&Caller::SecurityOff, "admin", Some(&root_user))),
            403
        );
        assert_eq!(st(delete_user(&admin2, "admin2", Some(&admin2_user))), 403);
        assert_eq!(st(delete_user(&root, "admin2", Some(&admin2_user))), 200);
        // A non-admin cannot grant itself anything.
        let pleb = principal("pleb", false, vec![g(Action::Produce, &["*"])]);
        let pleb_user = user("pleb", false, vec![g(Action::Produce, &["*"])]);
        assert_eq!(
            st(set_grants(&pleb, "pleb", Some(&pleb_user), &admin_grant)),
            403
        );
        assert_eq!(st(create_user(&pleb, &[])), 403);
    }

    #[test]
    fn password_change_rules() {
        use PasswordChange::*;
        let root_user = user("admin", true, vec![g(Action::Admin, &[])]);
        let admin2_user = user("admin2", false, vec![g(Action::Admin, &[])]);
        let billing = user("billing", false, vec![]);
        let root = principal("admin", true, vec![g(Action::Admin, &[])]);
        let admin2 = principal("admin2", false, vec![g(Action::Admin, &[])]);
        let bill = principal("billing", false, vec![g(Action::Produce, &["*"])]);
        let other = principal("other", false, vec![]);

        // Self: needs current_password, whoever one is.
        assert_eq!(
            change_password(&bill, "billing", Some(&billing), Some("cur")),
            Ok(VerifyCurrent)
        );
        assert_eq!(
            st(change_password(&bill, "billing", Some(&billing), None)),
            403
        );
        assert_eq!(
            st(change_password(&bill, "billing", Some(&billing), Some(""))),
            403
        );
        assert_eq!(
            change_password(&root, "admin", Some(&root_user), Some("cur")),
            Ok(VerifyCurrent)
        );
        assert_eq!(
            st(change_password(&root, "admin", Some(&root_user), None)),
            403
        );
        assert_eq!(
            change_password(&admin2, "admin2", Some(&admin2_user), Some("c")),
            Ok(VerifyCurrent)
        );
        // Admin resets any non-root password without it (a given one is ignored).
        assert_eq!(
            change_password(&admin2, "billing", Some(&billing), None),
            Ok(Reset)
        );
        assert_eq!(
            change_password(&admin2, "billing", Some(&billing), Some("x")),
            Ok(Reset)
        );
        assert_eq!(
            change_password(&root, "admin2", Some(&admin2_user), None),
            Ok(Reset)
        );
        // Only root changes root's password.
        assert_eq!(
            st(change_password(&admin2, "admin", Some(&root_user), None)),
            403
        );
        assert_eq!(
            st(change_password(
                &admin2,
                "admin",
                Some(&root_user),
                Some("guess")
            )),
            403
        );
        // Non-admins only their own; missing users do not leak to them.
        assert_eq!(
            st(change_password(
                &other,
                "billing",
                Some(&billing),
                Some("x")
            )),
            403
        );
        assert_eq!(st(change_password(&other, "ghost", None, None)), 403);
        assert_eq!(
            st(change_password(&other, "admin", Some(&root_user), None)),
            403
        );
        assert_eq!(st(change_password(&admin2, "ghost", None, None)), 404);
        // Security off: allowed, missing still 404.
        assert_eq!(
            change_password(&Caller::SecurityOff, "admin", Some(&root_user), None),
            Ok(Reset)
        );
        assert_eq!(
            st(change_password(&Caller::SecurityOff, "ghost", None, None)),
            404
        );
    }

    #[test]
    fn messages() {
        let bill = principal("billing", false, vec![]);
        assert_eq!(
            produce(&bill, "orders", None).unwrap_err().message(),
            "user billing may not produce to topic orders"
        );
        assert_eq!(
            manage(&bill, "orders", None).unwrap_err(),
            Denied::NotFound("topic orders not found".into())
        );
        assert_eq!(
            delete_user(&Caller::SecurityOff, "ghost", None).unwrap_err(),
            Denied::NotFound("user ghost not found".into())
        );
    }
}

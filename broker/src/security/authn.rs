//! Authentication (SPEC §4.1): HTTP Basic credentials checked against the replicated user
//! records, with a verified-credential cache, a negative cache and the per-username throttle.
//!
//! # Flow of [`Authenticator::begin`] (all cheap, under one short lock)
//!
//! 1. Unknown username → `401` at once (no hash, no attempt used).
//! 2. Verified cache hit whose user version equals the current record's → `Ok` (no argon2).
//!    The key is HMAC-SHA256(per-process random key, username ‖ password), so the cache
//!    never holds a password or anything a memory dump could brute-force offline without
//!    the key. The version (`User::version`) changes on every change of the record and is
//!    never reused, so a password change, a grants change, a deletion or a re-creation
//!    invalidates the entry at its next use. Entries also expire after
//!    [`AuthConfig::verified_ttl_ms`].
//! 3. Negative cache hit (the same wrong password for the same record version within 60 s)
//!    → `401` without using an attempt.
//! 4. The same credentials already being verified for the same record version →
//!    [`Step::Wait`]: the caller waits for that verification and starts over (it then hits
//!    one of the caches). Concurrent first requests of one client (a pool of connections to
//!    a node that just started) cost one argon2 and one attempt, never a `429`.
//! 5. No attempt left → `429` with `Retry-After` (throttle).
//! 6. Otherwise an attempt is taken and the caller must verify: [`Step::Verify`] carries a
//!    [`PendingVerification`] whose `verify()` runs argon2 (run it on `spawn_blocking`), then
//!    [`Authenticator::finish`] records the outcome: right → the attempt is given back and
//!    the credentials cached; wrong → the negative cache remembers them for 60 s.
//!
//! [`Authenticator::authenticate`] does all of it, with the verification on the blocking
//! pool and at most [`AuthConfig::max_parallel_verifications`] at once (argon2 uses 19 MiB
//! per verification and a core for ~30 ms).
//!
//! The grants in the returned [`Principal`] always come from the current record, never from
//! the cache. Audit events `auth.failed` and `auth.throttled` (SPEC §9) are logged here.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use hmac::{Hmac, Mac};
use narad_meta::{MetaState, User};
use parking_lot::Mutex;
use rand::RngCore;
use sha2::Sha256;

use super::password;
use super::throttle::{Clock, LoginThrottle, MonotonicClock, ATTEMPTS, REFILL_MS};
use super::{audit, Principal};

/// The `WWW-Authenticate` value sent with every `401` (SPEC §3.11).
pub use crate::error::WWW_AUTHENTICATE;

const MSG_REQUIRED: &str = "authentication required";
const MSG_MALFORMED: &str = "malformed Authorization header: expected Basic credentials";
const MSG_INVALID: &str = "invalid username or password";

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// `401` (with `WWW-Authenticate: Basic realm="narad"`).
    Unauthenticated(String),
    /// `429` with `Retry-After: retry_after_secs`.
    Throttled { retry_after_secs: u64 },
}

impl AuthError {
    /// 401 or 429.
    pub fn status(&self) -> u16 {
        match self {
            AuthError::Unauthenticated(_) => 401,
            AuthError::Throttled { .. } => 429,
        }
    }

    /// The `{"error":…}` message.
    pub fn message(&self) -> String {
        match self {
            AuthError::Unauthenticated(m) => m.clone(),
            AuthError::Throttled { retry_after_secs } => {
                format!("too many failed logins for this user; retry in {retry_after_secs} s")
            }
        }
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status(), self.message())
    }
}

impl std::error::Error for AuthError {}

/// Username and password from a Basic `Authorization` header. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Parses one `Authorization` header value: `Basic base64(user:pass)` (scheme
/// case-insensitive; padding optional). Anything else → `401`.
pub fn parse_basic(value: &[u8]) -> Result<Credentials, AuthError> {
    let malformed = || AuthError::Unauthenticated(MSG_MALFORMED.into());
    let value = std::str::from_utf8(value).map_err(|_| malformed())?.trim();
    let (scheme, token) = value.split_once(' ').ok_or_else(malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(malformed());
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = engine
        .decode(token.trim_start().as_bytes())
        .map_err(|_| malformed())?;
    let decoded = String::from_utf8(decoded).map_err(|_| malformed())?;
    let (username, password) = decoded.split_once(':').ok_or_else(malformed)?;
    if username.is_empty() {
        return Err(malformed());
    }
    Ok(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

/// The credentials of a request: none → `401 authentication required`; more than one
/// `Authorization` header or a malformed one → `401`.
pub fn credentials_from_headers(headers: &http::HeaderMap) -> Result<Credentials, AuthError> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(AuthError::Unauthenticated(MSG_REQUIRED.into()));
    };
    if values.next().is_some() {
        return Err(AuthError::Unauthenticated(MSG_MALFORMED.into()));
    }
    parse_basic(value.as_bytes())
}

/// The `Authorization` header value for `username:password` (clients, tests).
pub fn basic_header(username: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
    )
}

/// Tunables of the [`Authenticator`]; the defaults are SPEC §4.1 / §11.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// Failed attempts per username before `429` (5).
    pub attempts: u32,
    /// One attempt comes back per this many ms (12 s).
    pub refill_ms: u64,
    /// The same wrong password is answered from the negative cache this long (60 s).
    pub negative_ttl_ms: u64,
    /// A verified credential is trusted this long without a new argon2 (15 min), as long as
    /// the user record does not change.
    pub verified_ttl_ms: u64,
    /// Entries kept in each cache before the oldest are dropped.
    pub max_cache_entries: usize,
    /// argon2 verifications running at once (every caller: authentication and the current
    /// password of a password change).
    pub max_parallel_verifications: usize,
    /// argon2 verifications waiting for a slot at most; more are answered `429` with
    /// `Retry-After: 1` rather than queued without bound.
    pub max_waiting_verifications: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            attempts: ATTEMPTS,
            refill_ms: REFILL_MS,
            negative_ttl_ms: 60_000,
            verified_ttl_ms: 15 * 60_000,
            max_cache_entries: 10_000,
            max_parallel_verifications: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .max(1),
            max_waiting_verifications: 64,
        }
    }
}

/// HMAC-SHA256(process key, len(username) ‖ username ‖ password).
type Fingerprint = [u8; 32];

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// `User::version` of the record the password was checked against.
    version: u64,
    expires_ms: u64,
}

#[derive(Debug)]
struct Caches {
    verified: HashMap<Fingerprint, Entry>,
    negative: HashMap<Fingerprint, Entry>,
    throttle: LoginThrottle,
    /// Whether `auth.throttled` was logged for the current empty-bucket episode, per user.
    throttle_logged: HashMap<String, u64>,
    /// Verifications running, by credentials: later identical requests wait for them.
    inflight: HashMap<Fingerprint, InFlight>,
    next_sweep_ms: u64,
}

/// A verification in progress (see [`Step::Wait`]).
#[derive(Debug)]
struct InFlight {
    /// `User::version` it checks against.
    version: u64,
    /// Closed (sender dropped) when the verification ends, however it ends.
    done: tokio::sync::watch::Receiver<()>,
}

/// Ends when the verification it waits for ends (finished, or abandoned by its caller):
/// then call [`Authenticator::begin`] again.
#[derive(Debug)]
pub struct Waiter(tokio::sync::watch::Receiver<()>);

impl Waiter {
    /// Waits for the verification to end.
    pub async fn wait(mut self) {
        while self.0.changed().await.is_ok() {}
    }
}

/// A password check to run (argon2, CPU-heavy) before [`Authenticator::finish`].
#[derive(Debug)]
pub struct PendingVerification {
    user: Arc<User>,
    fingerprint: Fingerprint,
    password: String,
    /// Dropped when the verification ends: wakes the requests waiting on it.
    _done: tokio::sync::watch::Sender<()>,
}

impl PendingVerification {
    /// Runs argon2 against the record's hash. Blocking: call it on `spawn_blocking`.
    pub fn verify(&self) -> bool {
        password::verify(&self.password, &self.user.password_hash)
    }

    /// The username being checked.
    pub fn username(&self) -> &str {
        &self.user.username
    }
}

/// The outcome of [`Authenticator::begin`].
#[derive(Debug)]
pub enum Step {
    /// Decided without argon2 (cache, unknown user, throttle).
    Done(Result<Principal, AuthError>),
    /// The same credentials are being verified: wait, then `begin` again.
    Wait(Waiter),
    /// Run `pending.verify()` (blocking), then pass the answer to `finish`.
    Verify(PendingVerification),
}

/// Checks Basic credentials against user records. One per process, shared (`Arc`).
pub struct Authenticator {
    config: AuthConfig,
    clock: Arc<dyn Clock>,
    key: [u8; 32],
    caches: Mutex<Caches>,
    verify_permits: tokio::sync::Semaphore,
    /// Verifications waiting for or holding a permit (bounded by running + waiting).
    verify_queued: std::sync::atomic::AtomicUsize,
}

/// Releases a queue slot however the verification ends.
struct QueueSlot<'a>(&'a std::sync::atomic::AtomicUsize);
impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for Authenticator {
    fn default() -> Self {
        Self::new(AuthConfig::default(), Arc::new(MonotonicClock::new()))
    }
}

impl Authenticator {
    /// An authenticator with a fresh random cache key.
    pub fn new(config: AuthConfig, clock: Arc<dyn Clock>) -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Authenticator {
            caches: Mutex::new(Caches {
                verified: HashMap::new(),
                negative: HashMap::new(),
                throttle: LoginThrottle::new(config.attempts, config.refill_ms),
                throttle_logged: HashMap::new(),
                inflight: HashMap::new(),
                next_sweep_ms: 0,
            }),
            verify_permits: tokio::sync::Semaphore::new(config.max_parallel_verifications.max(1)),
            verify_queued: std::sync::atomic::AtomicUsize::new(0),
            config,
            clock,
            key,
        }
    }

    fn fingerprint(&self, creds: &Credentials) -> Fingerprint {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .expect("invariant: HMAC accepts any key length");
        mac.update(&(creds.username.len() as u64).to_be_bytes());
        mac.update(creds.username.as_bytes());
        mac.update(creds.password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Everything but argon2. `user` is the current record of `creds.username` (from the
    /// local `MetaState` view), `None` when there is no such user.
    pub fn begin(&self, user: Option<&Arc<User>>, creds: &Credentials) -> Step {
        let Some(user) = user else {
            audit::auth_failed(&creds.username, "unknown user");
            return Step::Done(Err(AuthError::Unauthenticated(MSG_INVALID.into())));
        };
        debug_assert_eq!(user.username, creds.username);
        let now = self.clock.now_ms();
        let fp = self.fingerprint(creds);
        let mut c = self.caches.lock();
        self.maybe_sweep(&mut c, now);

        match c.verified.get(&fp).copied() {
            Some(e) if e.version == user.version && now < e.expires_ms => {
                return Step::Done(Ok(Principal::from_user(user)));
            }
            Some(_) => {
                c.verified.remove(&fp);
            }
            None => {}
        }
        match c.negative.get(&fp).copied() {
            Some(e) if e.version == user.version && now < e.expires_ms => {
                return Step::Done(Err(AuthError::Unauthenticated(MSG_INVALID.into())));
            }
            Some(_) => {
                c.negative.remove(&fp);
            }
            None => {}
        }
        if let Some(f) = c.inflight.get(&fp) {
            // A closed channel is a verification that ended without `finish` (its caller
            // went away): this request verifies in its place.
            if f.version == user.version && f.done.has_changed().is_ok() {
                return Step::Wait(Waiter(f.done.clone()));
            }
            c.inflight.remove(&fp);
        }
        if let Err(retry_after_secs) = c.throttle.try_acquire(&user.username, now) {
            // Log once per empty-bucket episode (until the next attempt accrues).
            let due = now + retry_after_secs * 1000;
            let log = c
                .throttle_logged
                .get(&user.username)
                .is_none_or(|&until| now >= until);
            if log {
                c.throttle_logged.insert(user.username.clone(), due);
                audit::auth_throttled(&user.username);
            }
            return Step::Done(Err(AuthError::Throttled { retry_after_secs }));
        }
        let (done, waiting) = tokio::sync::watch::channel(());
        c.inflight.insert(
            fp,
            InFlight {
                version: user.version,
                done: waiting,
            },
        );
        Step::Verify(PendingVerification {
            user: user.clone(),
            fingerprint: fp,
            password: creds.password.clone(),
            _done: done,
        })
    }

    /// Records the outcome of `pending.verify()` and answers.
    pub fn finish(&self, pending: PendingVerification, ok: bool) -> Result<Principal, AuthError> {
        let now = self.clock.now_ms();
        let user = &pending.user;
        let mut c = self.caches.lock();
        if c.inflight
            .get(&pending.fingerprint)
            .is_some_and(|f| f.done.same_channel(&pending._done.subscribe()))
        {
            c.inflight.remove(&pending.fingerprint);
        }
        if ok {
            c.throttle.release(&user.username, now);
            c.negative.remove(&pending.fingerprint);
            if c.verified.len() >= self.config.max_cache_entries {
                evict_oldest(&mut c.verified);
            }
            c.verified.insert(
                pending.fingerprint,
                Entry {
                    version: user.version,
                    expires_ms: now + self.config.verified_ttl_ms,
                },
            );
            Ok(Principal::from_user(user))
        } else {
            if c.negative.len() >= self.config.max_cache_entries {
                evict_oldest(&mut c.negative);
            }
            c.negative.insert(
                pending.fingerprint,
                Entry {
                    version: user.version,
                    expires_ms: now + self.config.negative_ttl_ms,
                },
            );
            drop(c);
            audit::auth_failed(&user.username, "wrong password");
            Err(AuthError::Unauthenticated(MSG_INVALID.into()))
        }
    }

    /// [`begin`](Self::begin), argon2 inline, [`finish`](Self::finish): for sync callers
    /// that are already off the async runtime, and for tests.
    pub fn authenticate_blocking(
        &self,
        user: Option<&Arc<User>>,
        creds: &Credentials,
    ) -> Result<Principal, AuthError> {
        loop {
            match self.begin(user, creds) {
                Step::Done(r) => return r,
                Step::Wait(w) => futures::executor::block_on(w.wait()),
                Step::Verify(p) => {
                    let ok = p.verify();
                    return self.finish(p, ok);
                }
            }
        }
    }

    /// Authenticates `creds` against the user records of `state` (the node's current view);
    /// argon2 runs on the blocking pool, bounded by `max_parallel_verifications`.
    pub async fn authenticate(
        &self,
        state: &MetaState,
        creds: &Credentials,
    ) -> Result<Principal, AuthError> {
        loop {
            match self.begin(state.user(&creds.username), creds) {
                Step::Done(r) => return r,
                // The other verification's outcome is in a cache when this one starts over.
                Step::Wait(w) => w.wait().await,
                Step::Verify(p) => {
                    let joined = self
                        .run_argon2(move || {
                            let ok = p.verify();
                            (p, ok)
                        })
                        .await?;
                    return match joined {
                        Ok((p, ok)) => self.finish(p, ok),
                        Err(e) => Err(AuthError::Unauthenticated(format!(
                            "password check failed: {e}"
                        ))),
                    };
                }
            }
        }
    }

    /// Runs argon2 work on the blocking pool under the node-wide bound: at most
    /// `max_parallel_verifications` at once, at most `max_waiting_verifications` waiting;
    /// beyond that `429` (`Retry-After: 1`) without queueing.
    async fn run_argon2<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Result<T, tokio::task::JoinError>, AuthError> {
        use std::sync::atomic::Ordering;
        let bound =
            self.config.max_parallel_verifications.max(1) + self.config.max_waiting_verifications;
        if self.verify_queued.fetch_add(1, Ordering::AcqRel) >= bound {
            self.verify_queued.fetch_sub(1, Ordering::AcqRel);
            return Err(AuthError::Throttled {
                retry_after_secs: 1,
            });
        }
        let _slot = QueueSlot(&self.verify_queued);
        let _permit = self
            .verify_permits
            .acquire()
            .await
            .expect("invariant: the semaphore is never closed");
        Ok(tokio::task::spawn_blocking(work).await)
    }

    /// Checks `current` against `user`'s password for a password change (SPEC §4.2), through
    /// the same per-username throttle and argon2 bound as authentication: `Ok(true)` right,
    /// `Ok(false)` wrong (an attempt used), `Err(Throttled)` no attempt left or argon2 saturated.
    pub async fn verify_current_password(
        &self,
        user: &User,
        current: &str,
    ) -> Result<bool, AuthError> {
        let now = self.clock.now_ms();
        if let Err(retry_after_secs) = self.caches.lock().throttle.try_acquire(&user.username, now)
        {
            audit::auth_throttled(&user.username);
            return Err(AuthError::Throttled { retry_after_secs });
        }
        let (password, hash) = (current.to_string(), user.password_hash.clone());
        let ok = self
            .run_argon2(move || password::verify(&password, &hash))
            .await?
            .unwrap_or(false);
        if ok {
            self.caches
                .lock()
                .throttle
                .release(&user.username, self.clock.now_ms());
        } else {
            audit::auth_failed(&user.username, "wrong current password");
        }
        Ok(ok)
    }

    /// Headers → credentials → [`authenticate`](Self::authenticate).
    pub async fn authenticate_headers(
        &self,
        state: &MetaState,
        headers: &http::HeaderMap,
    ) -> Result<Principal, AuthError> {
        let creds = credentials_from_headers(headers)?;
        self.authenticate(state, &creds).await
    }

    /// Expired cache entries and full throttle buckets go, at most once a minute.
    fn maybe_sweep(&self, c: &mut Caches, now: u64) {
        if now < c.next_sweep_ms {
            return;
        }
        c.next_sweep_ms = now + 60_000;
        c.verified.retain(|_, e| now < e.expires_ms);
        c.negative.retain(|_, e| now < e.expires_ms);
        c.throttle.sweep(now);
        c.inflight.retain(|_, f| f.done.has_changed().is_ok());
        c.throttle_logged.retain(|_, until| now < *until);
    }

    /// Cache sizes `(verified, negative, throttled users)` (tests, metrics).
    pub fn cache_sizes(&self) -> (usize, usize, usize) {
        let c = self.caches.lock();
        (c.verified.len(), c.negative.len(), c.throttle.tracked())
    }

    /// Failed attempts still available to `username` now.
    pub fn attempts_left(&self, username: &str) -> u32 {
        let now = self.clock.now_ms();
        self.caches.lock().throttle.remaining(username, now)
    }
}

/// Drops the entry closest to expiry (O(n), only when a cache is full).
fn evict_oldest(map: &mut HashMap<Fingerprint, Entry>) {
    if let Some(k) = map
        .iter()
        .min_by_key(|(_, e)| e.expires_ms)
        .map(|(k, _)| *k)
    {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::password::HashParams;
    use narad_meta::{Action, Grant, MetaCommand, MetaResponse};

    fn creds(u: &str, p: &str) -> Credentials {
        Credentials {
            username: u.into(),
            password: p.into(),
        }
    }

    struct World {
        state: MetaState,
        clock: Arc<crate::security::throttle::ManualClock>,
        auth: Authenticator,
        now_ms: u64,
    }

    #[tokio::test]
    async fn current_password_checks_are_throttled_and_bounded() {
        let w = World::new();
        let billing = w.state.user("billing").unwrap().clone();
        assert_eq!(
            w.auth.verify_current_password(&billing, "right").await,
            Ok(true)
        );
        // Wrong ones use attempts; once they are gone: 429 without running argon2.
        for _ in 0..ATTEMPTS {
            assert_eq!(
                w.auth.verify_current_password(&billing, "wrong").await,
                Ok(false)
            );
        }
        assert!(matches!(
            w.auth.verify_current_password(&billing, "right").await,
            Err(AuthError::Throttled { .. })
        ));
        // A refill brings one attempt back, and the right password returns it.
        w.clock.advance(REFILL_MS);
        assert_eq!(
            w.auth.verify_current_password(&billing, "right").await,
            Ok(true)
        );
        assert_eq!(w.auth.attempts_left("billing"), 1);

        // Saturated argon2 (every slot running or waiting): 429 at once.
        let busy = Authenticator::new(
            AuthConfig {
                max_parallel_verifications: 1,
                max_waiting_verifications: 0,
                ..AuthConfig::default()
            },
            w.clock.clone(),
        );
        let held = busy.verify_permits.acquire().await.unwrap();
        busy.verify_queued
            .store(1, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            busy.verify_current_password(&billing, "right").await,
            Err(AuthError::Throttled {
                retry_after_secs: 1
            })
        );
        drop(held);
        busy.verify_queued
            .store(0, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            busy.verify_current_password(&billing, "right").await,
            Ok(true)
        );
    }

    impl World {
        fn new() -> Self {
            let clock = Arc::new(crate::security::throttle::ManualClock::new(1_000_000));
            let auth = Authenticator::new(AuthConfig::default(), clock.clone());
            let mut w = World {
                state: MetaState::default(),
                clock,
                auth,
                now_ms: 1,
            };
            let h = password::hash("rootpw", HashParams::TEST).unwrap();
            w.apply(MetaCommand::SeedRoot {
                password_hash: h,
                now_ms: 1,
            });
            w.add_user("billing", "right");
            w
        }

        fn apply(&mut self, cmd: MetaCommand) -> MetaResponse {
            self.now_ms += 1;
            self.state.apply(&cmd).unwrap()
        }

        fn add_user(&mut self, name: &str, pw: &str) {
            let h = password::hash(pw, HashParams::TEST).unwrap();
            let now_ms = self.now_ms;
            self.apply(MetaCommand::CreateUser {
                username: name.into(),
                password_hash: h,
                grants: vec![Grant {
                    action: Action::Produce,
                    patterns: vec!["orders-*".into()],
                }],
                root: false,
                now_ms,
            });
        }

        fn set_password(&mut self, name: &str, pw: &str) {
            let h = password::hash(pw, HashParams::TEST).unwrap();
            let now_ms = self.now_ms;
            self.apply(MetaCommand::SetPassword {
                username: name.into(),
                password_hash: h,
                now_ms,
            });
        }

        /// (result, whether argon2 ran)
        fn login(&self, u: &str, p: &str) -> (Result<Principal, AuthError>, bool) {
            match self.auth.begin(self.state.user(u), &creds(u, p)) {
                Step::Done(r) => (r, false),
                Step::Wait(_) => panic!("no verification runs in this test"),
                Step::Verify(pending) => {
                    let ok = pending.verify();
                    (self.auth.finish(pending, ok), true)
                }
            }
        }

        fn advance(&self, ms: u64) {
            self.clock.advance(ms);
        }
    }

    fn unauth(r: &Result<Principal, AuthError>) -> bool {
        matches!(r, Err(AuthError::Unauthenticated(_)))
    }

    #[test]
    fn parse_basic_accepts_and_rejects() {
        let ok = |v: &str| parse_basic(v.as_bytes());
        assert_eq!(
            ok(&basic_header("billing", "s3:cr et")).unwrap(),
            creds("billing", "s3:cr et")
        );
        assert_eq!(ok("basic YTpi").unwrap(), creds("a", "b"));
        assert_eq!(ok("BASIC   YTpi").unwrap(), creds("a", "b"));
        // Unpadded base64 ("a:bc" = YTpiYw==).
        assert_eq!(ok("Basic YTpiYw").unwrap(), creds("a", "bc"));
        assert_eq!(ok("Basic YTpiYw==").unwrap(), creds("a", "bc"));
        // Empty password is syntactically fine (it just never matches).
        assert_eq!(ok("Basic YTo=").unwrap(), creds("a", ""));
        for bad in [
            "",
            "Basic",
            "Basic ",
            "Bearer YTpi",
            "Basic !!!!",
            "Basic YWI=", // "ab": no colon
            "Basic OmI=", // ":b": empty username
            "Basic /w==", // not UTF-8
            "Digest YTpi",
        ] {
            match ok(bad) {
                Err(AuthError::Unauthenticated(m)) => assert_eq!(m, MSG_MALFORMED, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(parse_basic(b"Basic \xff").is_err());
    }

    #[test]
    fn credentials_from_headers_cases() {
        let mut h = http::HeaderMap::new();
        assert_eq!(
            credentials_from_headers(&h),
            Err(AuthError::Unauthenticated(MSG_REQUIRED.into()))
        );
        h.insert(
            http::header::AUTHORIZATION,
            basic_header("a", "b").parse().unwrap(),
        );
        assert_eq!(credentials_from_headers(&h).unwrap(), creds("a", "b"));
        h.append(
            http::header::AUTHORIZATION,
            basic_header("c", "d").parse().unwrap(),
        );
        assert!(credentials_from_headers(&h).is_err(), "two headers");
        assert!(!format!("{:?}", creds("a", "hunter2")).contains("hunter2"));
    }

    /// A pool of connections sending the same credentials to a node that just started: one
    /// argon2, one attempt taken and given back, every request authenticated (no `429`).
    #[tokio::test]
    async fn identical_concurrent_logins_share_one_verification() {
        let w = World::new();
        let billing = w.state.user("billing").unwrap().clone();
        let first = match w.auth.begin(Some(&billing), &creds("billing", "right")) {
            Step::Verify(p) => p,
            other => panic!("{other:?}"),
        };
        // More concurrent requests than there are attempts: all wait, none takes one.
        let waiters: Vec<Waiter> = (0..3 * ATTEMPTS)
            .map(
                |_| match w.auth.begin(Some(&billing), &creds("billing", "right")) {
                    Step::Wait(waiter) => waiter,
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert_eq!(w.auth.attempts_left("billing"), ATTEMPTS - 1);
        // A different password for the same user is a separate check (an attempt of its own).
        let other = match w.auth.begin(Some(&billing), &creds("billing", "guess")) {
            Step::Verify(p) => p,
            other => panic!("{other:?}"),
        };
        let ok = first.verify();
        assert!(w.auth.finish(first, ok).is_ok());
        for waiter in waiters {
            waiter.wait().await;
            let (r, verified) = w.login("billing", "right");
            assert!(r.is_ok() && !verified, "answered from the cache");
        }
        assert!(unauth(&w.auth.finish(other, false)));
        assert_eq!(w.auth.attempts_left("billing"), ATTEMPTS - 1);

        // A verification abandoned by its caller (request cancelled) wakes its waiters, and
        // the next request verifies in its place.
        w.advance(AuthConfig::default().verified_ttl_ms);
        let abandoned = match w.auth.begin(Some(&billing), &creds("billing", "right")) {
            Step::Verify(p) => p,
            other => panic!("{other:?}"),
        };
        let Step::Wait(waiter) = w.auth.begin(Some(&billing), &creds("billing", "right")) else {
            panic!("expected to wait")
        };
        drop(abandoned);
        waiter.wait().await;
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && verified);
        // And through `authenticate`, concurrently: every one succeeds.
        w.advance(AuthConfig::default().verified_ttl_ms);
        let right = creds("billing", "right");
        let all = futures::future::join_all(
            (0..4 * ATTEMPTS).map(|_| w.auth.authenticate(&w.state, &right)),
        )
        .await;
        assert!(all.iter().all(|r| r.is_ok()), "{all:?}");
    }

    #[test]
    fn unknown_user_fails_at_once_without_using_attempts() {
        let w = World::new();
        for _ in 0..20 {
            let (r, verified) = w.login("ghost", "x");
            assert!(unauth(&r) && !verified);
        }
        assert_eq!(w.auth.cache_sizes(), (0, 0, 0));
    }

    #[test]
    fn right_password_is_cached_and_gives_the_principal() {
        let w = World::new();
        let (r, verified) = w.login("billing", "right");
        let p = r.unwrap();
        assert!(verified);
        assert_eq!(p.username, "billing");
        assert!(!p.root);
        assert_eq!(p.grants[0].action, Action::Produce);
        // Keep-alive: the next requests pay no argon2.
        for _ in 0..3 {
            let (r, verified) = w.login("billing", "right");
            assert_eq!(r.unwrap(), p);
            assert!(!verified);
        }
        let (r, _) = w.login("admin", "rootpw");
        let root = r.unwrap();
        assert!(root.root && root.is_admin());
        // Expiry of the verified entry: argon2 again after the TTL.
        w.advance(AuthConfig::default().verified_ttl_ms);
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && verified);
    }

    #[test]
    fn cache_invalidated_by_password_change() {
        let mut w = World::new();
        assert!(w.login("billing", "right").0.is_ok());
        w.set_password("billing", "new");
        let (r, verified) = w.login("billing", "right");
        assert!(
            unauth(&r) && verified,
            "the old password is checked again and fails"
        );
        let (r, verified) = w.login("billing", "new");
        assert!(r.is_ok() && verified);
        // Changing back to the old password: the old negative entry must not block it.
        w.set_password("billing", "right");
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && verified);
    }

    #[test]
    fn cache_invalidated_by_deletion_and_recreation() {
        let mut w = World::new();
        assert!(w.login("billing", "right").0.is_ok());
        w.apply(MetaCommand::DeleteUser {
            username: "billing".into(),
        });
        let (r, verified) = w.login("billing", "right");
        assert!(unauth(&r) && !verified, "deleted user: 401 at once");
        // Re-created with the same password: verified afresh against the new record.
        w.add_user("billing", "right");
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && verified);
    }

    #[test]
    fn grants_always_come_from_the_current_record() {
        let mut w = World::new();
        assert!(w.login("billing", "right").0.is_ok());
        let now_ms = w.now_ms;
        w.apply(MetaCommand::SetGrants {
            username: "billing".into(),
            grants: vec![],
            now_ms,
        });
        let (r, _) = w.login("billing", "right");
        assert!(r.unwrap().grants.is_empty());
    }

    #[test]
    fn throttle_five_failures_then_429_and_refill() {
        let w = World::new();
        for i in 0..5 {
            let (r, verified) = w.login("billing", &format!("wrong{i}"));
            assert!(unauth(&r) && verified, "attempt {i}");
        }
        assert_eq!(w.auth.attempts_left("billing"), 0);
        // Distinct wrong passwords and even the right one: 429 now.
        let (r, verified) = w.login("billing", "wrong-new");
        assert_eq!(
            r,
            Err(AuthError::Throttled {
                retry_after_secs: 12
            })
        );
        assert!(!verified);
        assert_eq!(r.unwrap_err().status(), 429);
        w.advance(5_500);
        assert_eq!(
            w.login("billing", "right").0,
            Err(AuthError::Throttled {
                retry_after_secs: 7 // 6.5 s left, rounded up
            })
        );
        // Other users are not affected.
        assert!(w.login("admin", "rootpw").0.is_ok());
        // After 12 s one attempt is back: the right password passes and returns it.
        w.advance(6_500);
        assert_eq!(w.auth.attempts_left("billing"), 1);
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && verified);
        assert_eq!(
            w.auth.attempts_left("billing"),
            1,
            "a right password returns its attempt"
        );
        // And once verified, it passes even while the bucket is empty (no argon2 needed).
        assert!(unauth(&w.login("billing", "wrong-x").0));
        assert_eq!(w.auth.attempts_left("billing"), 0);
        let (r, verified) = w.login("billing", "right");
        assert!(r.is_ok() && !verified);
        // Full refill after 5 × 12 s.
        w.advance(60_000);
        assert_eq!(w.auth.attempts_left("billing"), 5);
    }

    #[test]
    fn repeated_wrong_password_uses_no_attempt_within_60s() {
        let w = World::new();
        let (r, verified) = w.login("billing", "oops");
        assert!(unauth(&r) && verified);
        assert_eq!(w.auth.attempts_left("billing"), 4);
        for _ in 0..50 {
            let (r, verified) = w.login("billing", "oops");
            assert!(unauth(&r) && !verified);
        }
        assert_eq!(w.auth.attempts_left("billing"), 4);
        // Still 401 (not 429) from the negative cache even once the bucket is empty.
        for i in 0..4 {
            assert!(unauth(&w.login("billing", &format!("w{i}")).0));
        }
        assert!(unauth(&w.login("billing", "oops").0));
        assert!(matches!(
            w.login("billing", "w-new").0,
            Err(AuthError::Throttled { .. })
        ));
        // After 60 s the negative entry is gone: the same wrong password costs an attempt.
        w.advance(60_000);
        assert_eq!(w.auth.attempts_left("billing"), 5);
        let (r, verified) = w.login("billing", "oops");
        assert!(unauth(&r) && verified);
        assert_eq!(w.auth.attempts_left("billing"), 4);
    }

    #[test]
    fn correct_password_returns_its_attempt() {
        let w = World::new();
        assert!(unauth(&w.login("billing", "a").0));
        assert!(unauth(&w.login("billing", "b").0));
        assert_eq!(w.auth.attempts_left("billing"), 3);
        assert!(w.login("billing", "right").0.is_ok());
        assert_eq!(w.auth.attempts_left("billing"), 3);
    }

    #[test]
    fn sweep_bounds_memory() {
        let w = World::new();
        for i in 0..5 {
            assert!(unauth(&w.login("billing", &format!("w{i}")).0));
        }
        assert!(w.login("admin", "rootpw").0.is_ok());
        assert_eq!(w.auth.cache_sizes(), (1, 5, 1));
        w.advance(60 * 60_000);
        assert!(unauth(&w.login("ghost", "x").0)); // unknown user: returns before the lock
        let (r, verified) = w.login("admin", "rootpw"); // sweeps everything expired first
        assert!(r.is_ok() && verified);
        assert_eq!(w.auth.cache_sizes(), (1, 0, 0));
    }

    #[test]
    fn cache_capacity_evicts() {
        let clock = Arc::new(crate::security::throttle::ManualClock::new(0));
        let auth = Authenticator::new(
            AuthConfig {
                max_cache_entries: 2,
                attempts: 100,
                ..AuthConfig::default()
            },
            clock.clone(),
        );
        let mut s = MetaState::default();
        s.apply(&MetaCommand::SeedRoot {
            password_hash: password::hash("pw", HashParams::TEST).unwrap(),
            now_ms: 0,
        })
        .unwrap();
        for i in 0..5 {
            clock.advance(1);
            let _ = auth.authenticate_blocking(s.user("admin"), &creds("admin", &format!("w{i}")));
        }
        assert_eq!(auth.cache_sizes().1, 2);
    }

    #[tokio::test]
    async fn async_authenticate_and_headers() {
        let w = World::new();
        let mut h = http::HeaderMap::new();
        assert_eq!(
            w.auth.authenticate_headers(&w.state, &h).await,
            Err(AuthError::Unauthenticated(MSG_REQUIRED.into()))
        );
        h.insert(
            http::header::AUTHORIZATION,
            basic_header("billing", "right").parse().unwrap(),
        );
        let p = w.auth.authenticate_headers(&w.state, &h).await.unwrap();
        assert_eq!(p.username, "billing");
        let r = w
            .auth
            .authenticate(&w.state, &creds("billing", "wrong"))
            .await;
        assert!(unauth(&r));
        assert_eq!(w.auth.attempts_left("billing"), 4);
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// What `basic_header` writes parses back, for any password and any username without
        /// a colon (the first colon ends the username).
        #[test]
        fn prop_basic_roundtrip(user in "[^:]{1,24}", password in any::<String>()) {
            let got = parse_basic(basic_header(&user, &password).as_bytes()).unwrap();
            prop_assert_eq!(got, Credentials { username: user, password });
        }

        /// Any header value: 401 or credentials with a non-empty, colon-free username whose
        /// `user:password` is exactly what the base64 token held.
        #[test]
        fn prop_basic_arbitrary(value in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..48),
            any::<String>().prop_map(String::into_bytes),
            ("(?i:basic)", "[ \\t]{0,3}", "[A-Za-z0-9+/=]{0,24}", "[ \\t]{0,2}")
                .prop_map(|(s, a, t, b)| format!("{s} {a}{t}{b}").into_bytes()),
            ("[ ]{0,2}(?i:basic) ", any::<String>())
                .prop_map(|(s, raw)| format!("{s}{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)).into_bytes()),
        ]) {
            match parse_basic(&value) {
                Ok(c) => {
                    prop_assert!(!c.username.is_empty() && !c.username.contains(':'));
                    let text = std::str::from_utf8(&value).unwrap().trim();
                    let token = text.split_once(' ').unwrap().1.trim_start();
                    let engine = base64::engine::GeneralPurpose::new(
                        &base64::alphabet::STANDARD,
                        base64::engine::GeneralPurposeConfig::new()
                            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
                    );
                    let raw = engine.decode(token).unwrap();
                    prop_assert_eq!(raw, format!("{}:{}", c.username, c.password).into_bytes());
                }
                Err(e) => prop_assert_eq!(e, AuthError::Unauthenticated(MSG_MALFORMED.into())),
            }
        }
    }
}

//! Leader election over a `coordination.k8s.io/v1` Lease: only the holder runs the
//! controllers. `decide` is the pure rule; `LeaderElector` reads and writes the Lease with
//! optimistic concurrency (`resourceVersion`), so two replicas never both win a term.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;

/// What to do with the Lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Free or expired: take it (a new term).
    Acquire,
    /// Ours: renew it.
    Renew,
    /// Someone else holds a live lease.
    Follow(String),
}

/// The rule: ours → renew; no holder, or not renewed within its duration → acquire;
/// else follow the holder.
pub fn decide(spec: &LeaseSpec, me: &str, now: Timestamp) -> LeaseDecision {
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return LeaseDecision::Renew;
    }
    if holder.is_empty() {
        return LeaseDecision::Acquire;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    match &spec.renew_time {
        Some(MicroTime(t)) if t.as_second() + duration > now.as_second() => {
            LeaseDecision::Follow(holder)
        }
        _ => LeaseDecision::Acquire,
    }
}

/// The spec after acquiring or renewing.
pub fn next_spec(spec: &LeaseSpec, me: &str, now: Timestamp, duration: Duration) -> LeaseSpec {
    let renewing = spec.holder_identity.as_deref() == Some(me);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration.as_secs() as i32),
        acquire_time: if renewing {
            spec.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + if renewing { 0 } else { 1 }),
        ..Default::default()
    }
}

/// Holds or waits for one named Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// Lease duration; renewals happen every third of it.
    pub duration: Duration,
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str) -> LeaderElector {
        LeaderElector {
            api,
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
        }
    }

    /// One attempt to acquire or renew: `Ok(true)` when we hold the lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        match self.api.get_opt(&self.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(next_spec(
                        &LeaseSpec::default(),
                        &self.identity,
                        now,
                        self.duration,
                    )),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                match decide(&spec, &self.identity, now) {
                    LeaseDecision::Follow(_) => Ok(false),
                    LeaseDecision::Acquire | LeaseDecision::Renew => {
                        lease.spec = Some(next_spec(&spec, &self.identity, now, self.duration));
                        // resourceVersion is kept: a concurrent writer makes this a 409.
                        match self
                            .api
                            .replace(&self.name, &PostParams::default(), &lease)
                            .await
                        {
                            Ok(_) => Ok(true),
                            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                            Err(e) => Err(e),
                        }
                    }
                }
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews until a renewal fails for longer than the lease duration (or another replica
    /// took it); returns then, and the caller must stop its controllers.
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    if last_ok.elapsed() >= self.duration {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held(by: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(ts(renewed))),
            lease_transitions: Some(3),
            acquire_time: Some(MicroTime(ts(1))),
            ..Default::default()
        }
    }

    #[test]
    fn rules() {
        assert_eq!(
            decide(&LeaseSpec::default(), "a", ts(100)),
            LeaseDecision::Acquire
        );
        assert_eq!(decide(&held("a", 90), "a", ts(100)), LeaseDecision::Renew);
        assert_eq!(
            decide(&held("b", 90), "a", ts(100)),
            LeaseDecision::Follow("b".into())
        );
        assert_eq!(
            decide(&held("b", 80), "a", ts(100)),
            LeaseDecision::Acquire,
            "expired"
        );
    }

    #[test]
    fn terms() {
        let taken = next_spec(&held("b", 80), "a", ts(100), Duration::from_secs(15));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(ts(100))));
        let renewed = next_spec(&held("a", 90), "a", ts(100), Duration::from_secs(15));
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, Some(MicroTime(ts(1))));
        assert_eq!(renewed.renew_time, Some(MicroTime(ts(100))));
    }
}

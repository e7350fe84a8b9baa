//! narad-operator: runs Narad on Kubernetes (SPEC §10.3).
//!
//! - `crd`: the four resources of `narad.io/v1alpha1` (types, schema, CEL rules) and the
//!   operator's own admission checks (`crd::validate`);
//! - `resources`: pure builders of what a NaradCluster owns (StatefulSet, Services, PDB,
//!   ConfigMap, Secret entries);
//! - `reconcile`: one reconciler per kind, each a pure plan plus a thin async shell calling
//!   the Kubernetes API and the broker (through `narad_api::Client`);
//! - `leader`: Lease-based leader election;
//! - `metrics`: the operator's Prometheus metrics and their endpoint;
//! - `run`: wiring of the controllers.
//!
//! State: none of its own; everything lives in the API server (spec, status, finalizers)
//! and in the broker.

pub mod crd;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod resources;
pub mod run;

#[cfg(test)]
mod fixtures;

//! Where partitions live and how they move (SPEC §6.5): the leader's [`Controller`] plans
//! moves (rebalance on join, shed draining nodes) and removes drained members; [`Moves`]
//! runs this node's side of each move (the owner's listing, chunks and freeze; the target's
//! verbatim copy and flip; the removal of old copies).

pub mod controller;
pub mod moves;

pub use controller::Controller;
pub use moves::Moves;

//! Multi-node cluster and fault tests (filled by the cluster work).

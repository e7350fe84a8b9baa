//! Structured logs through `tracing`: JSON lines by default, text for humans.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG` overrides the level when set.
pub fn init(level: &str, format: &str) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},openraft=warn,h2=warn,hyper=warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder.try_init()
    };
}

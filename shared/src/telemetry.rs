//! Logging: JSON lines in Lambda (CloudWatch Logs Insights can query them), compact text
//! elsewhere. `RUST_LOG` sets the filter (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once (default level `info`); later calls are no-ops.
pub fn init() {
    init_with_default("info");
}

/// Like [`init`], with another filter when `RUST_LOG` is not set.
pub fn init_with_default(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let in_lambda = std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some();
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if in_lambda {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .without_time()
            .try_init()
    } else {
        // Colours only on a terminal: piped or captured logs stay plain text.
        let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
        builder
            .compact()
            .with_target(false)
            .with_ansi(tty)
            .try_init()
    };
}

//! `sasctl`: parse the command line, run it, exit with its code.

use clap::Parser;
use sasctl::{Cli, run};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli, &mut std::io::stdout()).await {
        Ok(code) => code,
        // The reader went away (`sasctl list | head`): nothing left to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => sasctl::exit::OK,
        Err(e) => {
            eprintln!(
                "error: {:#}",
                anyhow::Error::new(e).context("cannot write output")
            );
            sasctl::exit::API
        }
    };
    std::process::exit(code);
}

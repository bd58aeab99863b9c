//! `slinky-host`: see `slinky-host --help`.

use clap::Parser;
use slinky_host::cli::{Cli, run};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    slinky_host::telemetry::init(&cli.global.log_level, cli.global.log_format);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

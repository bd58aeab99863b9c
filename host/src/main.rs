//! `slinky-host`: see `slinky-host --help`.

use clap::Parser;
use slinky_host::cmd::{Cli, dispatch};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    slinky_host::telemetry::init(cli.log_level(), cli.global.log_format);
    match dispatch(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // Our errors name their cause in their message; print a cause only when it adds to
            // what was printed (an `anyhow` context wraps one that does not).
            let mut message = error.to_string();
            for cause in error.chain().skip(1) {
                let cause = cause.to_string();
                if !message.contains(&cause) {
                    message = format!("{message}: {cause}");
                }
            }
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = ankusa_relay::cli::Cli::parse();
    match ankusa_relay::cli::main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ankusa-relay: error: {}", ankusa_relay::cli::error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

//! The `warden` binary: see `warden --help`.

fn main() -> std::process::ExitCode {
    warden_cli::main()
}

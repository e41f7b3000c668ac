//! The `warden` binary, built again inside this package so that Cargo hands
//! the integration tests its path (`CARGO_BIN_EXE_warden-under-test`) and
//! builds it with the test run's own features: a binary of another package
//! would be built separately, with another feature set, and could be stale.

fn main() -> std::process::ExitCode {
    warden_cli::main()
}

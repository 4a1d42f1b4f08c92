//! The `hbm-doctor` binary: parse arguments, run, exit with the contract's code.

fn main() -> std::process::ExitCode {
    hbm_doctor::main()
}

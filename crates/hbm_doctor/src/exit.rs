//! Exit codes, for every command (docs/contract.md).

/// Success; for `explain`, no OOM event in the input.
pub const OK: u8 = 0;
/// The tool worked and found what it looks for (an OOM event; a program that does not fit).
pub const FOUND: u8 = 1;
/// Usage, I/O or input error, with a one-line message saying what to do.
pub const USAGE: u8 = 2;

//! hbm-doctor's trend detector: tell a leak from a spike, a step or a sawtooth in device-memory
//! series, and forecast the step that will run out of memory.
//!
//! Pure: no I/O. [`reader::Reader`] parses chunks of bytes (recordings, CSV, TensorBoard
//! exports, PyTorch/XLA metrics reports, `memory_stats()`/`get_memory_info()` dicts, training
//! logs) into a bounded [`reader::Collected`]; [`report::report`] runs [`detect::analyze`] on
//! every device and builds the contract's `trend` JSON; [`live::Live`] runs the same detector
//! on a live feed.
//!
//! ```
//! use hbm_doctor_trend::{reader::{Collected, Reader}, report::report, detect::Params};
//! let mut c = Collected::default();
//! let mut r = Reader::new("", "mem.csv");
//! let mut csv = String::from("step,bytes_in_use,bytes_limit\n");
//! for s in 0..2000u64 {
//!     csv.push_str(&format!("{s},{},{}\n", 8_000_000_000 + s * 1_000_000, 16_000_000_000u64));
//! }
//! r.feed(&mut c, csv.as_bytes());
//! r.finish(&mut c);
//! let rep = report(&c, &Params::default());
//! assert_eq!(rep.series[0].verdict, "leak");
//! ```

pub mod detect;
pub mod live;
pub mod reader;
pub mod recording;
pub mod report;
pub mod simulate;
pub mod stats;
pub mod store;

/// Reads a whole byte slice (for tests and small inputs).
pub fn read_all(c: &mut reader::Collected, host: &str, name: &str, bytes: &[u8]) {
    let mut r = reader::Reader::new(host, name);
    r.feed(c, bytes);
    r.finish(c);
}

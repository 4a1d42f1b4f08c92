//! `hbm-doctor fit SCRIPT:FUNCTION --target v5e-8`: does a JAX program fit a TPU topology?
//!
//! The compile needs JAX and the TPU compiler (`jax[tpu]`), which live in the user's Python, so
//! this command runs the Python helper `hbm_doctor._fit_cli` (docs/fit.md) with the user's
//! interpreter and passes its exit code through: 0 fits, 1 does not fit, 2 error. The helper
//! compiles deviceless, then runs this same binary (`HBM_DOCTOR_BIN`) on the compiler's dump.

use crate::cli::GlobalArgs;
use crate::exit;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `hbm-doctor fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// `script.py:function` or `package.module:function`. With `--arg`, the function to compile;
    /// without, a builder called with no arguments (with the size, for `--max-batch`) that returns
    /// `(fn, args)`, `(fn, args, jit_kwargs)` or `hbm_doctor.jax.Program`.
    pub program: String,
    /// TPU to fit: v5e-8, v6e-4, v5p-8, v4-8 (v4/v5p count TensorCores), v5e (one chip), or a
    /// topology such as v5e:2x4.
    #[arg(long, short = 't', default_value = "v5e-8")]
    pub target: String,
    /// An abstract argument, in order: `f32[8192,1024]`, with `@data` to shard dim 0 over the
    /// mesh axis `data`, or `@data,_,model` per dim. Repeat for each argument.
    #[arg(long = "arg", value_name = "SHAPE[@SPEC]")]
    pub args: Vec<String>,
    /// Mesh axes over the target's devices: `data=8` or `data=4,model=-1` (default: one axis
    /// `data` over all devices).
    #[arg(long, value_name = "AXIS=N,...")]
    pub mesh: Option<String>,
    /// Also compile with every automatic fix (donation, jax.checkpoint policies, bf16
    /// parameters, micro-batches, the compiler's remat flags) and rank them by measured savings.
    #[arg(long)]
    pub try_fixes: bool,
    /// Search the largest batch (leading dim of the batch argument, or the builder's size) that fits.
    #[arg(long)]
    pub max_batch: bool,
    /// Which arguments hold the batch (default: the last).
    #[arg(long, value_name = "N,...")]
    pub batch_argnums: Option<String>,
    /// `donate_argnums` for `jax.jit`.
    #[arg(long, value_name = "N,...")]
    pub donate_argnums: Option<String>,
    /// A TPU compiler option `xla_tpu_...=VALUE` (never put TPU flags in XLA_FLAGS). Repeatable.
    #[arg(long = "compiler-option", value_name = "KEY=VALUE")]
    pub compiler_options: Vec<String>,
    /// Keep the compiler's dump of the program in this directory.
    #[arg(long, value_name = "DIR")]
    pub keep_dump: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = FitFormat::Human)]
    pub format: FitFormat,
    /// The Python interpreter that has `jax[tpu]` and hbm-doctor (default: $HBM_DOCTOR_PYTHON, the
    /// python beside this binary, then python3 on PATH).
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,
}

/// `fit --format`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum FitFormat {
    /// For people, in a terminal.
    Human,
    /// JSON (docs/fit.md).
    Json,
}

/// What the Python bootstrap exits with when `hbm_doctor` is not importable.
const NOT_INSTALLED: i32 = 3;

const BOOTSTRAP: &str = "import sys
try:
    from hbm_doctor._fit_cli import main
except ImportError as e:
    sys.stderr.write('hbm-doctor: error: %s cannot import hbm_doctor (%s): run `%s -m pip install hbm-doctor \"jax[tpu]\"`, or pass --python\\n' % (sys.executable, e, sys.executable))
    sys.exit(3)
sys.exit(main(sys.argv[1:]))
";

/// Runs `fit`.
pub fn run(args: &FitArgs, global: &GlobalArgs) -> Result<u8> {
    let python = find_python(args.python.as_deref())?;
    let mut argv: Vec<String> = vec![args.program.clone(), "--target".into(), args.target.clone()];
    for a in &args.args {
        argv.push("--arg".into());
        argv.push(a.clone());
    }
    let pairs = [
        ("--mesh", &args.mesh),
        ("--batch-argnums", &args.batch_argnums),
        ("--donate-argnums", &args.donate_argnums),
    ];
    for (flag, value) in pairs {
        if let Some(v) = value {
            argv.push(flag.into());
            argv.push(v.clone());
        }
    }
    for o in &args.compiler_options {
        argv.push("--compiler-option".into());
        argv.push(o.clone());
    }
    if let Some(d) = &args.keep_dump {
        argv.push("--keep-dump".into());
        argv.push(d.display().to_string());
    }
    if args.try_fixes {
        argv.push("--try-fixes".into());
    }
    if args.max_batch {
        argv.push("--max-batch".into());
    }
    argv.push("--format".into());
    argv.push(
        match args.format {
            FitFormat::Human => "human",
            FitFormat::Json => "json",
        }
        .into(),
    );
    if global.color.resolve_stdout() {
        argv.push("--color".into());
    }
    let mut cmd = Command::new(&python);
    cmd.arg("-c").arg(BOOTSTRAP).args(&argv);
    if let Ok(me) = std::env::current_exe() {
        cmd.env("HBM_DOCTOR_BIN", me);
    }
    let status = cmd.status().with_context(|| {
        format!(
            "cannot run `{}`: pass --python PATH to the interpreter that has jax[tpu] and hbm-doctor",
            python.display()
        )
    })?;
    match status.code() {
        Some(0) => Ok(exit::OK),
        Some(1) => Ok(exit::FOUND),
        // The bootstrap already said what to install, and where.
        Some(NOT_INSTALLED) => Ok(exit::USAGE),
        Some(_) => Ok(exit::USAGE),
        None => bail!("`{}` was killed by a signal", python.display()),
    }
}

/// The interpreter: `--python`, `$HBM_DOCTOR_PYTHON`, the python beside this binary (a venv's
/// `bin/` after `pip install hbm-doctor`), then `python3`/`python` on PATH.
fn find_python(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("HBM_DOCTOR_PYTHON").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let names: &[&str] = if cfg!(windows) {
        &["python.exe"]
    } else {
        &["python3", "python"]
    };
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            for n in names {
                let p = dir.join(n);
                if p.is_file() {
                    return Ok(p);
                }
            }
        }
    }
    bail!("no Python found: pass --python PATH (the interpreter that has jax[tpu] and hbm-doctor) or set HBM_DOCTOR_PYTHON")
}

//! Reads the figures of every known OOM message family out of a cleaned block of lines.
//!
//! A block is a window of a log around one or more anchor hits (see [`crate::scan`]). Each line
//! that starts a message ("headline") becomes a [`Piece`]; the lines after it, up to the next
//! headline, are read as its report (TPU `Total hbm usage` / `Largest program allocations`, GPU
//! `BufferAssignment stats` / `Peak buffers`, BFC `Stats:`). Headline patterns run over the line
//! joined with the next three, so messages wrapped at word boundaries still match.

use crate::clean::Line;
use crate::event::{
    Allocation, Backend, Event, Family, Framework, MemorySpace, Phase, Remat, Stage,
    WarningFigures, WarningKind,
};
use crate::size::parse_size;
use regex::{Captures, Regex};
use std::sync::OnceLock;

/// Something a block contributes: an event, or a fragment that belongs to a neighbouring event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// An out-of-memory message.
    Event(Box<Event>),
    /// A rematerialization warning, attached to the fatal event that follows it.
    Remat {
        /// 1-based line.
        line: u64,
        /// The figures.
        remat: Remat,
        /// The cleaned headline.
        message: String,
    },
    /// Lines that look like an OOM but are nothing to count; dropped.
    Skip,
    /// A known non-fatal warning (an allocator that retries, a BFC "not a failure"): counted
    /// and summarised, never an event.
    Warning {
        /// Which warning.
        kind: WarningKind,
        /// Its figures (`line` is the 1-based line).
        figures: WarningFigures,
    },
    /// Figures logged before the failure (the TPU compiler's rematerialization limit line names
    /// the program's arguments); attached to the next event.
    Context {
        /// 1-based line.
        line: u64,
        /// Bytes of the program's arguments.
        arguments: Option<u64>,
        /// Bytes of outputs aliased with arguments.
        aliased: Option<u64>,
        /// Bytes of the program's outputs (PyTorch/XLA post-compilation analysis).
        outputs: Option<u64>,
        /// Bytes of intermediates (PyTorch/XLA post-compilation analysis).
        temps: Option<u64>,
    },
    /// A BFC allocator `Stats:` block, attached to the allocator failure before it.
    AllocatorStats {
        /// 1-based line.
        line: u64,
        /// `Limit:`.
        limit: Option<u64>,
        /// `InUse:`.
        in_use: Option<u64>,
        /// `LargestFreeBlock:` or the newest `largest free chunk`.
        largest_free: Option<u64>,
    },
}

/// Size token: `28.50G`, `6.00MiB`, `6291456 bytes`, `1 234 567 bytes`, `14.30GiB (15360000000B)`.
const SZ: &str = r"(\d{1,3}(?:[ ,]\d{3})+\s?(?:bytes|B)|\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B|[KMGTPE]\b|bytes\b|B\b)(?:\s*\(\d+\s?(?:B|bytes)\))?)";

struct Patterns {
    tpu_hbm: Regex,
    hlo_temporaries: Regex,
    tc_sc: Regex,
    abort_early: Regex,
    vmem_stack: Regex,
    scoped_vmem: Regex,
    allocation_exceeds: Regex,
    runtime_alloc: Regex,
    could_not_allocate: Regex,
    program_load: Regex,
    program_load_alloc: Regex,
    gpu_oom: Regex,
    failed_request: Regex,
    bfc: Regex,
    remat: Regex,
    tf_oom: Regex,
    tf_gpu_bytes: Regex,
    tried_to_allocate: Regex,
    host_killed: Regex,
    shell_killed: Regex,
    generic: Regex,
    notebook_exception: Regex,
    not_memory: Regex,
    // report lines
    total_usage: Regex,
    kv_size: Regex,
    output_size: Regex,
    program_req: Regex,
    hlo_temp: Regex,
    largest_header: Regex,
    entry_size: Regex,
    gpu_buffer: Regex,
    field: Regex,
    bfc_stat: Regex,
    bfc_summary: Regex,
    largest_free: Regex,
    exec_name: Regex,
    op_name: Regex,
    op_type: Regex,
    source_file: Regex,
    source_line: Regex,
    ptxla_post: Regex,
    mem_info: Regex,
    space_only: Regex,
    async_alloc: Regex,
    cuda_free_total: Regex,
    host_pinned: Regex,
    cuda_device_warning: Regex,
    capacity: Regex,
    report_start: Regex,
    pool_limit: Regex,
    bin_for: Regex,
    step: Regex,
    remat_limit: Regex,
    usage_space: Regex,
    usage_total: Regex,
    usage_row: Regex,
    window: Regex,
}

fn p() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(&ascii_classes(&s.replace("SZ", SZ))).expect("valid built-in regex");
        Patterns {
            // Newer libtpu (Pallas kernels): "Ran out of memory in memory space vmem. Estimated
            // 268.96MB exceeds 67.11MB vmem capacity."
            // libtpu's error code may stand for the first sentence: `CompileTimeHbmOom — Used X of Y
            // hbm. Exceeded hbm capacity by Z.`
            tpu_hbm: re(r"(Compilation failure:\s+)?(?:Ran\s+out\s+of\s+memory\s+in\s+memory\s+space\s+(\w+)\.?|CompileTime(?:Hbm|ScopedVmem)Oom[\s:\-\x{2013}\x{2014}]+)\s*(?:Used|Estimated)\s+SZ\s+(?:of|exceeds)\s+SZ(?:\s+(\w+))?(?:\s+capacity)?\.?(?:\s+Exceeded\s+\w+\s+capacity\s+by\s+SZ)?"),
            hlo_temporaries: re(r"Ran\s+out\s+of\s+memory\s+on\s+(\w+),?\s+the\s+total\s+memory\s+required\s+for\s+HLO\s+temporaries\s+\(SZ\)\s+exceeds\s+available\s+\w+\s+\(SZ\)"),
            tc_sc: re(r"TensorCore\s+Hbm\s+usage:?\s+SZ,?\s+SparseCore\s+Hbm\s+usage:?\s+SZ,?\s+exceeding\s+available\s+bytes:?\s+SZ"),
            abort_early: re(r"Aborting\s+compilation\s+early\s+because\s+it's\s+unlikely\s+to\s+have\s+enough\s+memory\.?\s+Requires\s+SZ,?\s+has\s+SZ(?:\s+available)?"),
            vmem_stack: re(r"Ran\s+out\s+of\s+memory\s+in\s+memory\s+space\s+(\w+)\s+while\s+allocating\s+on\s+stack\s+for\s+(%?[\w.\-]+)\s*=\s*(\w+\[[^\]]*\](?:\{[^}]*\})?|\((?:[^()]|\([^()]*\))*\))"),
            scoped_vmem: re(r"Scoped\s+allocation\s+with\s+size\s+SZ\s+and\s+limit\s+SZ\s+exceeded\s+scoped\s+(\w+)\s+limit\s+by\s+SZ"),
            allocation_exceeds: re(r"Allocation\s+\(size=(\d+)\)\s+would\s+exceed\s+memory\s+\(size=(\d+)\)(?:\s*::\s*(#?[\w.\-]+)\s*\[shape\s*=\s*'([^']*)',\s*space=(\w+)(?:[^\]]*?tag\s*=\s*'([^']*)')?)?"),
            // 2022 TPU runtime: "Could not allocate 10485760 bytes in memory 0x0x0_HBM0; 4374528
            // bytes allocatable, 14942208 bytes available".
            could_not_allocate: re(r"Could\s+not\s+allocate\s+(\d+)\s+bytes\s+in\s+memory\s+([\w]+);\s+(\d+)\s+bytes\s+allocatable,\s+(\d+)\s+bytes\s+available"),
            // Newer libtpu: `Error loading program 'jit__forward': Attempting to allocate 1.13G.
            // That was not possible. There are 528.72M free.` (the program's own load, not a
            // buffer of a running program).
            program_load_alloc: re(r"Error\s+loading\s+program(?:\s+'([^']+)')?:\s+Attempting\s+to\s+allocate\s+SZ\.?\s+That\s+was\s+not\s+possible\.?\s+There\s+are\s+SZ\s+free"),
            runtime_alloc: re(r"(?:Error\s+allocating\s+device\s+buffer:\s+)?Attempting\s+to\s+allocate\s+SZ\.?\s+That\s+was\s+not\s+possible\.?\s+There\s+are\s+SZ\s+free\.?(?:;?\s*\(([\w]+)\))?"),
            program_load: re(r"(?:Error\s+loading\s+program(?:\s+'([^']+)')?:\s+)?Attempting\s+to\s+reserve\s+SZ\s+at\s+the\s+bottom\s+of\s+memory\.?(?:\s+That\s+was\s+not\s+possible\.?)?(?:\s+There\s+are\s+SZ\s+free,\s+SZ\s+reserved,\s+and\s+SZ\s+reservable)?"),
            // A size, or the placeholder a user typed for sizes that vary (`allocate X bytes`,
            // `xxxx bytes`).
            // XLA's allocator; older jaxlib wrote `Out of memory allocating 20029400304 bytes.`
            // (CuPy's `Out of memory allocating 1,073,741,824 bytes (allocated so far: ...` has
            // its own family: the full stop after `bytes` tells them apart).
            // (Quoted without its unit, `allocate 12531662848`, or retyped as `allocate ~140GB`.)
            gpu_oom: re(r"Out\s+of\s+(host\s+)?memory\s+(?:while\s+trying\s+to\s+allocate\s+(?:~\s*)?(?:SZ|(?:[A-Z]|[xX]{2,}|N+)\s+bytes\b|(\d{6,})\b)|allocating\s+(\d+)\s+bytes\s*\.)"),
            failed_request: re(r"Failed\s+to\s+allocate\s+request\s+for\s+SZ(?:\s+\((\d+)B\))?(?:\s+on\s+device\s+ordinal\s+(\d+))?"),
            // (A line cut in the middle of `trying`, the end of a pasted excerpt, still names
            // its allocator: an event without its request.)
            bfc: re(r"(?:Allocator\s+\(([\w:\-]+)\)\s+ran|Ran)\s+out\s+of\s+memory\s+(?:trying\s+to\s+allocate\s+SZ(?:\s+\(rounded\s+to\s+(\d+)\))?|tr?y?i?n?g?[ \t]*(?m:$))"),
            remat: re(r"Can't\s+reduce\s+memory\s+use\s+below\s+SZ(?:\s+\((\d+)\s+bytes\))?\s+by\s+rematerialization;?\s+only\s+reduced\s+to\s+SZ(?:\s+\((\d+)\s+bytes\))?(?:,\s+down\s+from\s+SZ(?:\s+\((\d+)\s+bytes\))?)?"),
            tf_oom: re(r#"OOM\s+when\s+allocating\s+tensor\b\s*(?:(?:with|of)\s+shape\s*)?\[?([\d,\s]*)\]?(?:\s+and\s+type\s+(\w+)(?:\s+on\s+(\S+?)(?:\s+by\s+allocator\s+(\w+))?)?)?(?:[\s.,"*`']|$)"#),
            // TF 1.x's GPU allocator: "Ran out of GPU memory when allocating 956701080 bytes for".
            tf_gpu_bytes: re(r"Ran\s+out\s+of\s+GPU\s+memory\s+when\s+allocating\s+(\d+)\s+bytes"),
            tried_to_allocate: re(r"(?i)(?:Tried|trying)\s+to\s+allocate\s+(SZ)"),
            host_killed: re(r"(?:Out\s+of\s+memory:\s+Killed\s+process|oom-kill:.*?task=|Killed\s+process)\s*(\d+)?\s*\(?([\w.\-]*)\)?"),
            // The shell's word for a process the kernel killed (`Killed`, `./run.sh: line 3: 812
            // Killed  python train.py`, `zsh: killed  python`), the same word quoted as the output
            // a user got, or printed at the end of a progress bar the process was drawing
            // (`Loading checkpoint shards:  38%|███▊    | 3/8 [00:02<00:03,  1.28it/s]Killed`), or
            // SIGKILL said with memory; a worker of torch.multiprocessing killed
            // (`ProcessExitedException: process 1 terminated with signal SIGKILL`: xmp.spawn's
            // TPU workers, the kernel's OOM killer's signal; `DataLoader worker (pid 19597) is
            // killed by signal: Killed.`); Colab's `Your session crashed after
            // using all available RAM`.
            shell_killed: re(r#"(?:it/s|s/it)\]\s*[Kk]illed\s*$|^\s*(?:[Kk]illed\s*$|(?:\S+:\s+line\s+\d+:\s+\d+\s+|zsh:\s+|\[\d+\][+-]?\s+\d+\s+)[Kk]illed\b.*$|\d+\s+[Kk]illed\s{2,}\S.*$)|["'`][Kk]illed["'`]|(?i:\bSIGKILL\b.*(?:out[- ]of[- ]memory|\boom\b|\bram\b)|(?:out[- ]of[- ]memory|\boom\b)\S*.*\bSIGKILL\b)|(?:ProcessExitedException:\s*|exception:\s*)?process\s+\d+\s+terminated\s+with\s+signal\s+SIGKILL|\bOOMKilled\b|已杀死|DataLoader\s+worker\s+\(pid\s+\d+\)\s+is\s+killed\s+by\s+signal:\s+(?:Killed|Terminated|Bus\s+error)|interrupted\s+by\s+signal\s+9\s*:\s*SIGKILL|Your\s+session\s+crashed\s+after\s+using\s+all\s+available\s+RAM|Your\s+notebook\s+tried\s+to\s+allocate\s+more\s+memory\s+than\s+is\s+available|exits\s+with\s+return\s+code\s*=\s*-9\b|\bexitcode\s*:\s*-9\b|died\s+with\s+<Signals\.SIGKILL:\s*9>|Signal\s+9\s+\(SIGKILL\)\s+received\s+by\s+PID|Detected\s+\d+\s+oom-kill\s+events?(?:\(s\))?\s+in\s+(?:StepId=|step\s)"#),
            generic: re(r"RESOURCE_EXHAUSTED|Resource\s+exhausted|ResourceExhausted|Ran\s+out\s+of\s+memory|[Oo]ut\s+of\s+memory|OOM\s+when|ScopedVmemOom|out\s+of\s+memory"),
            notebook_exception: re(r"^\s*(?:tensorflow\.python\.framework\.errors_impl\.)?ResourceExhaustedError\s+Traceback\s+\(most\s+recent\s+call\s+last\)"),
            not_memory: re(r"(?i)\b(?:not|n't|never)\s+(?:\w+\s+){0,2}out\s+of\s+memory|message\s+larger\s+than\s+max|quota|rate\s+limit|too\s+many\s+(?:requests|open\s+files)|grpc|file\s+descriptors|disk\s+space|no\s+space\s+left|not\s+a\s+failure|Garbage\s+collection|could\s+be\s+performance\s+gains|tf\.data|could\s+not\s+be\s+rematerialized\s+because"),
            total_usage: re(r"^Total\s+(\w+)\s+usage\s*>=\s*SZ"),
            kv_size: re(r"^\[?(reserved|program|arguments|global|scoped|HLO temp|parameter allocation|constant allocation|maybe_live_out allocation|preallocated temp allocation|total allocation|total fragmentation)\]?:?\s+(SZ|unknown size)"),
            output_size: re(r"^Output\s+size\s+SZ(?:;\s+shares\s+SZ\s+with\s+arguments)?"),
            program_req: re(r"^Program\s+(\w+)\s+requirement\s+SZ"),
            hlo_temp: re(r"^HLO\s+temp\s+SZ\s*\(\s*([\d.]+)%\s+utilization(?::\s+Unpadded\s+\(SZ\)\s+Padded\s+\(SZ\))?,?\s+([\d.]+)%\s+fragmentation\s+\(SZ\)"),
            largest_header: re(r"^Largest\s+program\s+allocations\s+in\s+(\w+)"),
            entry_size: re(r"^(\d+)\.\s+Size:\s+SZ"),
            gpu_buffer: re(r"^Buffer\s+(\d+):(?:\s+Size:\s+SZ)?"),
            field: re(r"^(Size|Operator|Shape|Unpadded size|Extra memory due to padding|XLA label|XLA Label|Allocation type|Entry Parameter Subshape):\s*(.*)$"),
            bfc_stat: re(r"^(?:Stats:\s*)?(Limit|InUse|MaxInUse|LargestFreeBlock|Reserved|PeakReserved):\s+(SZ|\d+)\b"),
            bfc_summary: re(r"Sum\s+Total\s+of\s+in-use\s+chunks:\s*SZ"),
            largest_free: re(r"(?i)largest\s+(?:contiguous\s+)?(?:free\s+(?:block|region|chunk)|region\s+of\s+free\s+memory)[^\d]{0,40}SZ"),
            exec_name: re(r"(?:executable_name='|Executable\(|program\s+'|module\s+'?)((?:jit_|pjit_|xmap_|pmap_|SyncTensorsGraph)[\w.\-]*)"),
            op_name: re(r#"op_name="([^"]*)"?"#),
            op_type: re(r#"op_type="([^"]*)""#),
            source_file: re(r#"source_file="([^"]*)""#),
            source_line: re(r"source_line=(\d+)"),
            ptxla_post: re(r"(Graph input size|Graph output size|Aliased Input size|Intermediate tensor size|Compiled program size):\s*([\d.]+)\s*GB"),
            mem_info: re(r"'(bytes_used|bytes_limit|peak_bytes_used|kb_free|kb_total)':\s*(\d+)"),
            space_only: re(r"Ran\s+out\s+of\s+memory\s+in\s+memory\s+space\s+(\w+)"),
            async_alloc: re(r"(\w+)?\s*cuMemAllocAsync\s+failed\s+to\s+allocate\s+(\d+)\s*bytes"),
            cuda_free_total: re(r"Free\s+memory/Total\s+memory:\s*(\d+)\s*/\s*(\d+)"),
            host_pinned: re(r"(?:failed\s+to\s+alloc(?:ate)?\s+(\d+)\s+bytes\s+on\s+host|could\s+not\s+allocate\s+pinned\s+host\s+memory\s+of\s+size:\s*(\d+))"),
            // Newer XLA: "Failed to allocate device memory of 59.38GiB (63763906560 bytes):
            // RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory" (cuda_executor.cc),
            // printed for each smaller size JAX's preallocation and the BFC region growth retry.
            cuda_device_warning: re(r"(?:failed\s+to\s+allocate\s+\S+\s+\((\d+)\s+bytes\)\s+from\s+devic\s*e|Failed\s+to\s+allocate\s+device\s+memory\s+of\s+\S+\s+\((\d+)\s+bytes\)):\s+(?:RESOURCE_EXHAUSTED:\s*:\s*)?CUDA_ERROR_OUT_OF_MEMORY"),
            capacity: re(r"^(\w+)\s+capacity\s+SZ:?"),
            report_start: re(r"^(?:(Largest\s+program\s+allocations\s+in\s+(\w+))|(Peak\s+buffers:|BufferAssignment\s+OOM\s+Debugging)|(?:Program\s+(\w+)\s+requirement|Total\s+(\w+)\s+usage\s*>=)|((?:\d+\.\s+)?Size:\s+\d|Allocation\s+type:|XLA\s+[lL]abel:)|(Stats:\s*$|Stats:\s+Limit|.*memory_limit_))"),
            // `step 120`, `iteration: 5`, and a progress line's `epoch 7, it 7990` (tqdm-like).
            step: re(r"(?i)\b(?:step|iteration|iter|global_step)\b\s*[=:#]?\s*(\d{1,9})\b|\bepoch\s*\d+\s*[,|]\s*it\s*[=:#]?\s*(\d{1,9})\b"),
            remat_limit: re(r"rematerialization\s+limit\s+SZ\s*=\s*[\d.]+%\s+\w+\s+\(SZ\)\s*-\s*\(arguments\s+\(SZ\)\s*-\s*aliased_output\s*\(SZ\)\)"),
            usage_space: re(r"^Memory\s+Space:\s+(\w+)"),
            usage_total: re(r"^Total\s+bytes:\s+(\d+)"),
            usage_row: re(r"^SZ\(\s*\d+%\);\s*SZ;\s*(\d+);\s*(\d+);\s*(.*)$"),
            window: re(r"window\s+shape\s+is\s+(\w+\[[^\]]*\]),\s+while\s+the\s+full\s+shape\s+is\s+(\w+\[[^\]]*\])"),
            bin_for: re(r"Bin\s+for\s+SZ\s+was\s+SZ,?\s+Chunk\s+State"),
            pool_limit: re(r"memory_limit_:\s*SZ|memory_limit_:\s*(\d+)"),
        }
    })
}

/// Log text is matched with ASCII classes: Unicode `\d`, `\s`, `\w` and `\b` compile to large
/// automata, and compiling ~60 of them dominated the start-up of a one-line `explain`.
pub(crate) fn ascii_classes(pattern: &str) -> String {
    pattern
        .replace(r"\d", "[0-9]")
        .replace(r"\s", r"[\t\n\x0B\x0C\r ]")
        .replace(r"\w", "[0-9A-Za-z_]")
        .replace(r"\b", r"(?-u:\b)")
}

fn size(c: &Captures<'_>, i: usize) -> Option<u64> {
    c.get(i).and_then(|m| parse_size(m.as_str()))
}

/// Quick test: can this cleaned line start an OOM message?
fn may_start(text: &str) -> bool {
    // The scanner's anchors, plus report lines that only matter once a block is open (and that
    // are too common to anchor a multi-GB search on).
    const MORE: [&str; 8] = [
        "of memory",
        "requirement",
        "Size:",
        "Stats:",
        "Limit:",
        "InUse:",
        "Hbm usage",
        "on host",
    ];
    crate::scan::ANCHORS
        .iter()
        .chain(MORE.iter())
        .any(|k| text.contains(k))
}

/// The largest input read for failures told in words (a post, a notebook's output): machine-written
/// logs print their failures, and the bare word `OOM` is too common a byte sequence to anchor a
/// multi-GB scan on.
pub const TOLD_MAX_BYTES: usize = 1 << 20;

/// A failure told in words (`it meets cuda oom error`, an issue title `OOM during training on
/// v3-8`) in a small text where no printed failure was found: the first such sentence, as an
/// event with no figure. Lines the scanner's anchors reach are read by the scan itself.
pub fn told_failure(input: &[u8]) -> Option<Event> {
    if input.len() > TOLD_MAX_BYTES {
        return None;
    }
    let pat = p();
    if let Some(e) = headless_gpu_buffers(input) {
        return Some(e);
    }
    let mut told: Option<(u64, Box<Event>)> = None;
    let raw_lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    for (number, raw) in (1u64..).zip(raw_lines.iter().copied()) {
        let quick = memchr::memmem::find(raw, b"OOM").is_some()
            || memchr::memmem::find(raw, b"oom").is_some()
            || memchr::memmem::find(raw, b"OUT OF MEMORY").is_some()
            || memchr::memmem::find(raw, b"ut-of-memory").is_some();
        // Messages too rare to anchor the scan of a multi-GB log on (every anchor slows its SIMD
        // search), read in small texts: PyTorch's cudaMallocAsync headline cut before its `(out
        // of memory)`, Colab's RAM crash, RMM's pool, ROCm MIOpen's buffer, Windows' paging file
        // in another language (`[WinError 1455] 页面文件太小`).
        let rare = [
            &b"Allocation on device"[..],
            b"all available RAM",
            b"RMM failure",
            b"Memory not available to allocate",
            b"WinError 1455",
            b"buffer of size",
            b"memory pool (needed",
            b"Device memory allocation of size",
            b"storage allocation failure",
            b"vkAllocateMemory failed",
            b"ErrorOutOfDeviceMemory",
            b"CPUAllocator.cpp",
            b"prefill tokens",
            b"OOMKilled",
            // XLA's and TF's GPU libraries starved of memory by a preallocated pool (JAX's and
            // TF's documented symptoms): no memory word in the message.
            b"best cudnn convolution algorithm",
            b"Failed to get convolution algorithm",
            b"cuSolver has not been initialized",
            b"GetBlasGemmAlgorithms",
            b"terminated with signal SIGKILL",
            // TensorRT 8+: `Error Code 2: OutOfMemory (Requested size was N bytes.)`.
            b": OutOfMemory",
            // Apple's MLX allocator.
            b"[malloc_or_wait]",
            b"[metal::malloc]",
            "已杀死".as_bytes(),
            // MLC LLM's plan, Metal's per-buffer cap, Sophgo's bmlib, tcmalloc's failed large
            // allocation, a Rust server's error enum, launchers reporting a child killed by
            // signal 9 (the kernel's OOM killer), Kaggle's notice.
            b"Insufficient GPU memory error",
            b"bytes of scratch space",
            b"could not allocate collective",
            b"must not exceed",
            b"bm_alloc_gmem",
            b"== (nil)",
            b"NotEnoughMemory(",
            b"return code = -9",
            b"exitcode",
            b"allocate more memory than is available",
            // TensorFlow's copy to a GPU that has no memory left for the tensor.
            b"Dst tensor is not initialized",
            // AWS Neuron's compiler and runtime, Intel XPU's block cap, DirectML.
            b"be allocated in SB",
            b"Failed to alloc DEVICE memory",
            b"can NOT allocate memory block",
            b"not enough GPU video memory",
            // Python's own exception, bare (`MemoryError`), and PyTorch's class heading a
            // notebook's traceback (`OutOfMemoryError    Traceback (most recent call last)`).
            b"MemoryError",
            b"OutOfMemoryError ",
            // ONNX Runtime, IREE, OpenVINO, Spark RAPIDS, CatBoost's tree counters, Core ML,
            // Jetson, OpenCL, Ray's memory monitor, Kubernetes' eviction.
            b"requested buffer of size",
            b"hipErrorOutOfMemory",
            b"[GPU] ",
            b"Initial RMM allocation",
            b"tree-ctrs",
            b"Memory allocation error 12",
            b"NvMapMemAlloc",
            b"Memory Object Allocation Failure",
            b"running low on memory",
            b"low on resource: memory",
            b"std::bad_alloc",
            // LLM engines' start-up refusals (ExLlamaV2, TensorRT-LLM), Metal's command buffer.
            b"Insufficient VRAM",
            b"insufficient GPU memory",
            b"kIOGPUCommandBufferCallbackErrorOutOfMemory",
            // NVIDIA Warp's arrays; PyTorch's message pasted from `Tried to allocate` on.
            b"Array allocation failed",
            // MindSpore's allocator on Ascend.
            b"TotalUsedMemStatistics",
            b"Tried to allocate",
            // Faiss's temporary memory (`Faiss assertion err == cudaSuccess failed in ...
            // StackDeviceMemory::Stack::getAlloc`).
            b"::getAlloc",
            b"CUBLAS_STATUS_NOT_INITIALIZED",
            // Rockchip's NPU, Habana's workspace, AWS NKI's state buffer.
            b"failed to malloc npu memory",
            b"workspace Allocation of size",
            b"Allocated memory out of bound",
            // Spark RAPIDS' spill handler, NVIDIA DALI, vLLM V1's start-up check.
            b"device store has",
            b" bytes on device ",
            b"CUDA allocation failed",
            b"on startup is less than desired",
            // TVM's and MLC's Vulkan runtime.
            b"VK_ERROR_OUT_OF_DEVICE_MEMORY",
        ]
        .iter()
        .any(|k| memchr::memmem::find(raw, k).is_some());
        if !quick && !rare {
            continue;
        }
        // TensorRT's builder logs `Error Code 2: OutOfMemory` for a tactic whose workspace it
        // could not get, then skips the tactic (`Skipping tactic ... due to insufficient
        // memory`) and goes on: not the failure.
        if memchr::memmem::find(raw, b": OutOfMemory").is_some()
            && memchr::memmem::find(input, b"Skipping tactic").is_some()
        {
            continue;
        }
        let text = crate::clean::clean_line(raw);
        // A rare message a terminal wrapped in the middle (`RMM failure at:.../devi` / `ce/pool_
        // memory_resource.hpp:183: Maximum pool size exceeded`): read with the next line glued.
        let found = headline(&text, number, pat).or_else(|| {
            let next = raw_lines.get(number as usize)?;
            (rare && raw.len() >= 60).then_some(())?;
            let glued = format!(
                "{}{}",
                text.trim_end(),
                crate::clean::clean_line(next).trim_start()
            );
            headline(&glued, number, pat)
        });
        if let Some((Piece::Event(mut e), _)) = found {
            // A message printed further down says more than a sentence telling the failure
            // (`I'm getting OOM errors even with small files.` ... `MemoryError`).
            if rare && e.fatal && !e.told {
                with_context(&mut e, input, number, pat);
                return Some(*e);
            }
            if e.told && told.is_none() {
                told = Some((number, e));
            }
        }
    }
    if let Some((number, mut e)) = interrupted_while_loading(input) {
        with_context(&mut e, input, number, pat);
        return Some(e);
    }
    if let Some((number, mut e)) = told {
        with_context(&mut e, input, number, pat);
        return Some(*e);
    }
    let (number, mut e) = prose_failure(input)?;
    with_context(&mut e, input, number, pat);
    Some(e)
}

/// Colab's notebook output when the runtime's RAM ran out under a `!python` command: the
/// process is killed and the cell prints `^C`, here as the last line, right after the model's
/// weights began to load (`Loading checkpoint shards:   0% 0/2 [00:00<?, ?it/s]^C`, `Loading
/// weights [6569e224] from .../x.ckpt` then `^C`). A `^C` elsewhere is a user's interrupt.
/// (In the labelled posts every such ending is the host's memory, settled by the maintainers.)
fn interrupted_while_loading(input: &[u8]) -> Option<(u64, Event)> {
    // Cleaned as any pasted text is (quotes, rank and service prefixes).
    let cleaned = crate::clean::clean_block(input, 1);
    let mut lines = cleaned
        .iter()
        .map(|l| (l.number, l.text.trim().to_string()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with("```"));
    let (number, text) = lines.next_back()?;
    let loading = |l: &str| l.to_ascii_lowercase().contains("loading");
    let at_end = text == "^C" && lines.next_back().is_some_and(|(_, prev)| loading(&prev));
    let on_bar = text.ends_with("]^C") && loading(&text);
    if !(at_end || on_bar) {
        return None;
    }
    let mut e = new_event(number, Family::HostOom, Phase::Runtime, &text);
    e.memory_space = Some(MemorySpace::Host);
    Some((number, e))
}

/// XLA:GPU's peak buffers pasted without the error line and without their `Peak buffers:` line
/// (`Buffer 13:` / `Size: 506.25MiB` / `Operator: ...` / `XLA Label: custom-call` / `Shape:
/// f32[1,64,1080,1920]`, at column 0 or indented): the listing the allocator prints only when an
/// allocation failed, read as the partial event the full report would give (`partial`, the
/// buffers as its largest allocations).
fn headless_gpu_buffers(input: &[u8]) -> Option<Event> {
    if memchr::memmem::find(input, b"XLA Label:").is_none()
        || memchr::memmem::find(input, b"Peak buffers").is_some()
    {
        return None;
    }
    // Cleaned as any pasted text is (quotes, rank and service prefixes, entities).
    let lines = crate::clean::clean_block(input, 1);
    let text = |i: usize| lines[i].text.trim();
    let start = (0..lines.len()).find(|&i| {
        let buffer = text(i).strip_prefix("Buffer ").is_some_and(|r| {
            r.strip_suffix(':')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
        buffer
            && (i + 1..lines.len().min(i + 8)).any(|j| text(j).starts_with("XLA Label:"))
            && (i + 1..lines.len().min(i + 3)).any(|j| text(j).starts_with("Size:"))
    })?;
    // The listing as the allocator prints it under its header.
    let mut listing = b"Peak buffers:\n".to_vec();
    for i in start..lines.len() {
        listing.push(b'\t');
        listing.extend_from_slice(text(i).as_bytes());
        listing.push(b'\n');
    }
    let mut scanner = crate::scan::Scanner::new();
    scanner.scan(&listing, true);
    let (events, _) = scanner.finish_with_warnings();
    let mut e = events.into_iter().find(|e| !e.allocations.is_empty())?;
    let number = lines[start].number;
    e.line = number;
    e.message = text(start).to_string();
    e.partial = true;
    e.backend = Some(Backend::Gpu);
    e.memory_space = Some(MemorySpace::Device);
    with_context(&mut e, input, number, p());
    Some(e)
}

/// The text around a failure found in words is evidence as for a printed failure: the framework,
/// the device named, growth said in words, the stage.
fn with_context(e: &mut Event, input: &[u8], number: u64, pat: &Patterns) {
    let lines = crate::clean::clean_block(input, 1);
    let at = lines
        .iter()
        .position(|l| l.number >= number)
        .unwrap_or(lines.len());
    let hints = Hints::of(&lines);
    hints.apply(e);
    // `CUDA out of memory` told in a PyTorch program's post (a path into the torch package,
    // no PyTorch/XLA marker) is PyTorch's caching allocator's message, not the CUDA runtime's own
    // (`CUDA error: out of memory`).
    // A request told with its size, in the sentence or the lines after it (`... I run out of
    // memory. JAX complains I am trying to allocate 938.07 GiB of memory`), or in the post's
    // title above it (`CUDA OOM: Trying to allocate 2548.47 GiB when processing ...`).
    if e.told && e.requested_bytes.is_none() {
        let after = &lines[at.min(lines.len())..(at + 6).min(lines.len())];
        e.requested_bytes = after
            .iter()
            .chain(lines.first().filter(|_| at > 0))
            .find_map(|l| pat.tried_to_allocate.captures(&l.text))
            .and_then(|c| c.get(1).and_then(|m| parse_size(m.as_str())));
    }
    // Figures printed under a headline read from its line alone (no scan anchor reaches it).
    if e.message.contains("couldn't be allocated in SB") {
        for l in lines.iter().skip(at).take(16) {
            crate::families::read_neuron_sb(e, l.text.trim());
        }
    }
    if e.message.contains("Executor creation failed") {
        for l in lines.iter().skip(at).take(8) {
            crate::families::read_trtllm_executor(e, l.text.trim());
        }
    }
    let torch = e.framework == Some(Framework::Pytorch)
        || (e.framework == Some(Framework::PytorchXla) && !hints.torch_xla);
    if e.told && e.family == Family::CudaOom && torch {
        e.family = Family::PytorchCudaOom;
        e.framework = Some(Framework::Pytorch);
    }
    // An OOM told with no memory named (`可是却出现了OOM`), in a PyTorch post on an NVIDIA GPU
    // (no TPU named): the device's, PyTorch's message.
    let on_gpu = e.backend == Some(Backend::Gpu) || (e.backend.is_none() && hints.gpu);
    if e.told && e.family == Family::Unrecognized && torch && on_gpu && !hints.tpu {
        e.family = Family::PytorchCudaOom;
        e.framework = Some(Framework::Pytorch);
        e.backend = Some(Backend::Gpu);
        e.memory_space = e.memory_space.or(Some(MemorySpace::Device));
    }
    read_progress(e, &lines[..at], pat);
    read_stage(
        e,
        &lines[..(at + 1).min(lines.len())],
        &lines[(at + 1).min(lines.len())..],
    );
    hints.apply_stage(e);
}

/// A pull request's description (`Fixes #2241` or `Closes #142` on a line of its own, a `What
/// does this PR do?` heading): the messages it prints are examples of the change (the wording
/// before and after it, the failure it fixes), not a failure of this run. labelling.md: text that
/// only talks about OOMs is not an OOM. On the labelled posts these markers are in 15 texts, all
/// of them labelled `none`.
pub fn pull_request(input: &[u8]) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?im)^\s*(?:fixes|closes|resolves)\s+#\d+\s*$|^#+\s*what does this pr\b")
            .expect("pull request markers")
    });
    input.len() <= TOLD_MAX_BYTES && re.is_match(&String::from_utf8_lossy(input))
}

/// A failure a person reports in their own words, in any phrasing (`after two days it stopped
/// because of OOM error`, `I cropped 800x800 and get oom for a few steps`, `my model on colab
/// has OOM issues`), where no printed failure and no known first-person phrase was found.
///
/// Most texts that name an OOM without printing one are either a user's report or talk about
/// OOMs (a pull request's description, a fix summary, advice, a table). The sentence decides:
/// it names the failure, says nothing of a remedy, a possibility, a negation or other people,
/// and it is the user's own (first person), or the post is an issue report (its template's
/// sections, an environment block). A pull request's or changelog's markers anywhere rule the
/// whole text out. Measured on the labelled posts (docs/explain.md): it finds 17 reports the
/// phrase list missed for 5 texts it takes wrongly.
fn prose_failure(input: &[u8]) -> Option<(u64, Event)> {
    static RES: OnceLock<[Regex; 8]> = OnceLock::new();
    let [oom, talk, first_person, change, template, machine, got_oom, still] = built_in(
        &RES,
        [
            r"(?i)\b(?:oom|ooms|oomed|oom-?kill\w*|out[- ]of[- ]memory|outofmemory\w*|out of (?:gpu |cuda |cpu |host |system |video |device )?(?:v?ram|memory)|ran out of|run out of|runs out of|running out of|not enough (?:gpu |cuda |v)?(?:memory|ram|vram)|insufficient (?:gpu |cpu |host |system |graphics? )?(?:memory|ram|vram)|(?:memory|ram)\b[^.;!?]{0,100}?\b(?:killed|killing|got restarted|crash(?:es|ed|ing)?)|(?:ram|memory|vram)\s+(?:is|was|gets|got|becomes|became)\s+(?:completely\s+)?full|fail(?:ed|s)?\s+(?:when\s+|while\s+)?trying\s+to\s+allocate\s+[\d.]+\s*[kmgt]i?b|memoryerror|memory\s+error|(?:gpu\s+|graphics\s+|video\s+|cuda\s+)?memory\s+overflow|cannot\s+allocate\s+memory|(?:process|script|job|program|training|kernel)\s+(?:gets?|got|was|is|keeps\s+getting)\s+(?:always\s+|constantly\s+|often\s+)?killed)\b",
            r"(?i)\b(?:fix\w*|avoid\w*|prevent\w*|reduc\w*|could|might|may|would|should|you|your|optimi[sz]\w*|support\w*|add\w*|feature|can cause|can lead|cause[sd]? by|to allow|users?|sometimes|common|explain\w*|documentation|docs?|otherwise|got rid|not|no|never|without|missing|whether|records?|if needed|investigat\w*|root cause|eliminat\w*|previous\w*|formerly|used\s+to|overcome|solve|solves|solving|solution|need to|needs to|often|usually|frequently|in case|whenever|unless|can\s+(?:fail|crash|run\s+out|oom|hit|throw|raise|cause))\b|n't\b",
            r"(?i)\b(?:i|i'm|i've|im|my|me|we|our|us)\b",
            r"(?im)this pr\b|this pull request|this change|this patch|this commit|\bmerged\b|^#+\s*(?:(?:[^\w\s]|\p{M})+\s*)?(?:pr\s+)?(?:changes|summary|motivation|what does this)|changelog|^\s*(?:fixes|closes|resolves) #|\blgtm\b|co-authored-by",
            r"(?i)describe the bug|to reproduce|reproduction|expected behavio|system info|environment|nvidia-smi|python version|\bos:|\bgpu:|operating system|error log",
            r"^\s*(?:\[?\d{4}-\d\d-\d\d|[IWEF]\d{4} |\[\w+\]|\w+Error\b|Traceback|File \x22)|\bbytes\b|Error Code|\w+\.(?:cc|py|cpp|h):\d+",
            r"(?i)\b(?:got|gets|getting|hit|hits|hitting|did|do|does|shows|showed|gives|gave|throws|threw|raises|raised|reports|reported|produces?|produced|encounter(?:s|ed)?|experienc(?:es|ed)|(?:ran|runs|running)\s+into|meets|met|fac(?:es|ed|ing)|prompt(?:s|ed)?(?:\s+that)?|(?:it|this|that)\s+(?:is|was)(?:\s+still)?|fail(?:s|ed)?\b[^.;:]{0,60}?\bwith|(?:crash(?:es|ed)?|fail(?:s|ed)?|dies|died|stops|stopped|aborts|aborted)\b[^.;:]{0,60}?\b(?:due\s+to|because\s+of))\s+(?:with\s+)?(?:an?\s+|the\s+(?:same\s+)?|this\s+|that\s+)?['\x22`]?(?:(?:cuda|gpu|cpu|tpu|hbm|host)\s+)?(?:oom|ooms|out[- ]of[- ]memory|outofmemory\w*|resource exhaustion|memoryerror|memory error)\b|\b(?:oom|out[- ]of[- ]memory|outofmemory\w*|memoryerror|memory error)(?:\s+errors?)?\s+(?:always\s+|suddenly\s+|then\s+)?(?:happened|happens|occurred|occured|occurs|appeared|appears)\b|\b(?:ran\s+out\s+of|oomed|oom-?killed|(?:got|was)\s+(?:oom-?)?killed)\b",
            r"(?i)\b(?:tried|try|trying|reduced|reducing|lowered|lowering|decreased|decreasing|set|setting|changed|used|using|even\s+with|even\s+after)\b[^.?!]{0,120}?\b(?:but|and|yet)\s+(?:it|that|this|training|inference|the\s+\w+\s+)?\s*(?:still|again)\b[^.?!]{0,24}?\b(?:oom|ooms|oomed|out[- ]of[- ]memory|out of (?:gpu |cuda |v)?(?:ram|memory))\b|\b(?:oom|ooms|oomed|out[- ]of[- ]memory|out of (?:gpu |cuda |v)?(?:ram|memory))\b[^.?!]{0,40}?\beven\s+(?:if|when|after|with|though)\s+(?:i|we)\b",
        ],
    );
    let text = String::from_utf8_lossy(input);
    if change.is_match(&text) {
        return None;
    }
    let issue = template.is_match(&text);
    let mut fence = false;
    for (number, line) in (1u64..).zip(text.lines()) {
        let t = line.trim_start();
        if t.starts_with("```") {
            fence = !fence;
            continue;
        }
        // Code, tables, headings, quotes, links and machine-written lines are not the user's
        // words (a printed message is the scan's).
        // (A heading that is a sentence is the user's words typed into an issue form's heading:
        // `### During the training, there was no problem with the first few epoch, but suddenly
        // OOM happened.`)
        let said_in_heading =
            t.starts_with('#') && t.trim_end().ends_with('.') && t.split_whitespace().count() >= 10;
        if fence
            || line.contains('|')
            || line.starts_with("    ")
            || (t.starts_with(['#', '>']) && !said_in_heading)
            || t.starts_with("http")
            || machine.is_match(line)
            // (A quoted allocator warning that says itself it is not one: BFC's `ran out of
            // memory trying to allocate ... The caller indicates that this is not a failure`.)
            || line.contains("not a failure")
        {
            continue;
        }
        // Told in Chinese (`可是却出现了OOM`, `使用ds_z3_config.json会OOM`, `但出现了CUDA内存不足的问题`):
        // the failure verb right before the words; a clause that asks, or talks of a remedy or
        // a possibility, is not a report.
        if !line.is_ascii() {
            if let Some(clause) = cjk_failure(line) {
                let (family, backend, space) = told_memory(line);
                let mut e = new_event(number, family, Phase::Runtime, clause.trim());
                e.told = true;
                e.backend = backend;
                e.memory_space = space;
                return Some((number, e));
            }
        }
        for sentence in sentences(line) {
            // A remedy tried and failed is a report, though it names the remedy (`I even tried
            // reducing the micro_batch_size to 1 but it still runs out of memory`).
            let persisted = !sentence.contains('?') && still.is_match(sentence);
            // The words of a remedy, a negation or a possibility count in the clause that tells
            // the failure: `it doesn't work as I get cuda out of memory error` reports one (a
            // clause of the user's own after `as I` / `because I` / `since I` / `but I`).
            if !oom.is_match(sentence) {
                continue;
            }
            // (The failure's own words are not its negation: `there is not enough RAM to train`.)
            let clause = oom.replace_all(own_clause(sentence, oom), " ");
            if talk.is_match(&clause) && !persisted {
                continue;
            }
            let mine = first_person.is_match(sentence);
            // A run's own failure told in the third person, its verb on the failure (`The
            // program got OOM before the training began`, `it did with OOM`, `FPN(resnet34) do
            // OOM`), a statement, not a question or a condition.
            // (A relative clause is a kind of case, not a run: `operations that fail with OOM`.)
            let happened = persisted
                || !sentence.contains('?')
                    && got_oom.find(sentence).is_some_and(|m| {
                        let before = sentence[..m.start()].trim_end().to_ascii_lowercase();
                        // (Nor failures counted in the plural: `tests fail with OOM errors`.)
                        let after = sentence[m.end()..].trim_start().to_ascii_lowercase();
                        let relative = before.ends_with(" that") || before.ends_with(" which");
                        // (`it crashes due to OOM errors` names one failure's cause: not a count.)
                        let cause = m.as_str().contains("due") || m.as_str().contains("because");
                        let plural = !cause
                            && ["errors", "issues", "problems", "failures"]
                                .iter()
                                .any(|p| after.starts_with(p));
                        !relative && !plural
                    })
                    && !sentence
                        .split(|c: char| !c.is_ascii_alphabetic())
                        .any(|w| w.eq_ignore_ascii_case("if") || w.eq_ignore_ascii_case("unless"));
            if (sentence.contains('?') || !issue) && !mine && !happened {
                continue;
            }
            // The memory the sentence names decides; when it names none, the rest of its line
            // (`it OOM'd a regular colab ... Why does it require >30GB of RAM to run?`).
            let (family, backend, space) = match told_memory(sentence) {
                (Family::Unrecognized, None, None) => told_memory(line),
                found => found,
            };
            // `a permanent compile error`, `OOM while compiling`: the compiler's failure.
            let phase = if sentence.to_ascii_lowercase().contains("compil") {
                Phase::Compile
            } else {
                Phase::Runtime
            };
            let mut e = new_event(number, family, phase, sentence.trim());
            e.told = true;
            e.backend = backend;
            e.memory_space = space;
            return Some((number, e));
        }
    }
    None
}

/// The clause of a sentence that tells the failure: from the last clause break before the words
/// that name it to the first one after. The words of a remedy, a negation or a possibility count
/// only there: `it doesn't work as I get cuda out of memory error` reports one (`I get cuda out of
/// memory error`), and so does `I encountered a 'CUDA out of memory' error, despite the sequence
/// not appearing particularly large`; `To avoid OOM, ...` and `I don't get OOM` do not.
fn own_clause<'a>(sentence: &'a str, oom: &Regex) -> &'a str {
    let lower = sentence.to_ascii_lowercase();
    let Some(m) = oom.find(sentence) else {
        return sentence;
    };
    // (Breaks before the failure: punctuation, a contrast, or a clause of the user's own.)
    const BEFORE: [&str; 19] = [
        ", ",
        // (`I'm not sure why the machine is running out of memory`: the failure is stated, the
        // doubt is about its cause.)
        " sure why ",
        " know why ",
        "; ",
        ": ",
        " - ",
        " -> ",
        " --> ",
        " but ",
        " bur ",
        " however ",
        " despite ",
        " although ",
        " though ",
        " as i ",
        " because i ",
        " since i ",
        " as we ",
        " because we ",
    ];
    // (Breaks after it: punctuation, a contrast, a condition or a reason that follows; not
    // `unless`, which makes a statement of what a program does: `and OOMs unless we train with`.)
    const AFTER: [&str; 14] = [
        ", ",
        "; ",
        ": ",
        " - ",
        " but ",
        " despite ",
        " although ",
        " though ",
        " even ",
        " if ",
        " which ",
        " when ",
        " because ",
        " since ",
    ];
    let start = BEFORE
        .iter()
        .filter_map(|k| lower[..m.start()].rfind(k).map(|i| i + k.len()))
        .max()
        .unwrap_or(0);
    let end = AFTER
        .iter()
        .filter_map(|k| lower[m.end()..].find(k).map(|i| m.end() + i))
        .min()
        .unwrap_or(sentence.len());
    sentence.get(start..end).unwrap_or(sentence)
}

/// The clause of a line that tells a failure in Chinese: a failure verb (`出现`, `报`, `遇到`,
/// `发生`, `会`, `爆`, `提示`) right before OOM or the words for memory running short, in a clause
/// that does not ask (`？`, `吗`) and does not talk of a remedy or a possibility.
fn cjk_failure(line: &str) -> Option<&str> {
    static RE: OnceLock<[Regex; 2]> = OnceLock::new();
    let [said, talk] = built_in(
        &RE,
        [
            r"(?:出现|出現|报|報|遇到|碰到|发生|發生|会|會|爆|提示|导致|導致|直到)了?\s*(?:(?i:cuda|gpu|npu)\s*)?(?:OOM|oom|内存不足|内存资源不足|显存不足|顯存不足|記憶體不足|显存溢出|内存溢出|out of memory|Out of memory|out-of-memory|(?i:cannot allocate memory|memoryerror))",
            r"避免|解决|解決|如何|怎么|怎樣|修复|修復|可能|如果|是否|为什么|為什麼|防止|减少|減少|降低|방지|해결\s*방법|어떻게|경우에는|방법|않|どうすれば|回避|防ぐ|しない|しません|ないよう",
        ],
    );
    static KO_JA: OnceLock<Regex> = OnceLock::new();
    // Told in Korean (`OOM 문제가 발생합니다`, `cuda out of memory가 뜨는`) or Japanese
    // (`OOMが発生しました`, `メモリ不足で落ちます`): the failure's words, then the verb that it
    // happened (발생 / 뜨 / 나; 発生 / 出 / 落ち / なり).
    let ko_ja = KO_JA.get_or_init(|| {
        Regex::new(r"(?i)(?:\boom|out of memory|outofmemory\w*|메모리\s*부족|메모리\s*초과|メモリ不足|メモリーエラー)\s*(?:error|에러|오류|문제|エラー)?\s*(?:가|이|が|に|で)?\s*(?:발생|뜨|떠|나[요는고]|났|発生|出|落ち|なり|なっ)")
            .expect("told failure, Korean and Japanese")
    });
    if let Some(c) = line
        .split(['。', '．', '!', '.', '\n'])
        .find(|c| ko_ja.is_match(c) && !talk.is_match(c) && !c.contains(['？', '?']))
    {
        return Some(c);
    }
    line.split(['，', '。', '；', '！', ',', ';'])
        .find(|c| said.is_match(c) && !talk.is_match(c) && !c.contains(['？', '?', '吗', '嗎']))
}

/// The family, backend and memory a told failure's words name (`None`s when they name none).
/// The memory named decides over the device named (`the TPU VM runs out of RAM` is the host's).
fn told_memory(words: &str) -> (Family, Option<Backend>, Option<MemorySpace>) {
    let lower = words.to_ascii_lowercase();
    let has = |ks: &[&str]| ks.iter().any(|k| lower.contains(k));
    // A word standing alone (`cpu` in `+cpu`, a version tag, is not the host).
    let has_word = |ks: &[&str]| {
        ks.iter().any(|k| {
            lower.match_indices(k).any(|(i, _)| {
                let before = lower[..i].chars().next_back();
                let after = lower[i + k.len()..].chars().next();
                before.is_none_or(|c| c == ' ' || c == '-' || c == '(' || c == '>')
                    && after.is_none_or(|c| !c.is_ascii_alphanumeric())
            })
        })
    };
    if has(&["cuda", "gpu", "vram", "nvidia", "graphic"]) {
        (
            Family::CudaOom,
            Some(Backend::Gpu),
            Some(MemorySpace::Device),
        )
    } else if !has(&["tpu memory", "hbm"]) && has_word(&["ram", "cpu", "host", "killed", "laptop"])
        || has(&["system memory", "my system", "my machine", "my computer"])
        // (`I'm not sure why the machine is running out of memory`.)
        || has(&["the machine is", "the machine ran", "the machine runs"])
        // Python's `MemoryError` and the kernel's ENOMEM (`Cannot allocate
        // memory`) are the host's, and so is what `htop` shows.
        || has(&["memoryerror", "cannot allocate memory", "htop"])
    {
        (Family::HostOom, None, Some(MemorySpace::Host))
    } else if has(&["tpu", "hbm"]) {
        (
            Family::Unrecognized,
            Some(Backend::Tpu),
            Some(MemorySpace::Hbm),
        )
    } else {
        (Family::Unrecognized, None, None)
    }
}

/// A line's sentences: split after `.`, `!` or `?` followed by a space.
fn sentences(line: &str) -> impl Iterator<Item = &str> {
    let b = line.as_bytes();
    let mut start = 0;
    let mut cuts = Vec::new();
    for i in 0..b.len().saturating_sub(1) {
        // (Not after an abbreviation: `cards (e.g. RTX 3060) hit OOM` is one sentence.)
        let abbreviation = b[i] == b'.'
            && [&b"e.g."[..], b"i.e.", b"etc.", b"vs."]
                .iter()
                .any(|a| b[..=i].ends_with(a));
        if matches!(b[i], b'.' | b'!' | b'?') && b[i + 1].is_ascii_whitespace() && !abbreviation {
            cuts.push((start, i + 1));
            start = i + 1;
        }
    }
    cuts.push((start, b.len()));
    cuts.into_iter().map(move |(a, z)| &line[a..z])
}

/// Parses one cleaned block into pieces, in order.
pub fn parse_block(lines: &[Line]) -> Vec<Piece> {
    let pat = p();
    let hints = Hints::of(lines);
    let mut heads: Vec<(usize, usize, Piece)> = Vec::new(); // (first line, lines used, piece)
    let mut i = 0;
    while i < lines.len() {
        let text = &lines[i].text;
        if text.is_empty() || !may_start(text) {
            i += 1;
            continue;
        }
        let end = (i + 4).min(lines.len());
        let flat = lines[i..end]
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let mut found = headline(&flat, lines[i].number, pat)
            .map(|(piece, used)| (piece, flat[..used].matches('\n').count() + 1));
        // How much a reading says: nothing, an unrecognized OOM, a family named by its words
        // only (as a message cut by a terminal reads), a family with figures.
        let score = |f: &Option<(Piece, usize)>| match f {
            None => 0,
            Some((Piece::Event(e), _)) if e.family == Family::Unrecognized => 1,
            Some((Piece::Event(e), _)) if e.figure_count() == 0 => 2,
            Some(_) => 3,
        };
        // PyTorch's headline read alone (`CUDA out of memory. Tried to allocate X`, one figure)
        // may be the start of a message the terminal cut: the glued reading is tried too.
        let torch_head = |f: &Option<(Piece, usize)>| matches!(f, Some((Piece::Event(e), _)) if e.family == Family::PytorchCudaOom && (e.figure_count() <= 1 || e.free_bytes.is_none()));
        // A failure told in words is a sentence, not a message cut by a terminal.
        let told = |f: &Option<(Piece, usize)>| matches!(f, Some((Piece::Event(e), _)) if e.told);
        let bare = |f: &Option<(Piece, usize)>| (score(f) < 3 || torch_head(f)) && !told(f);
        if bare(&found) && lines[i].raw_len >= 60 && end > i + 1 {
            let fallback = found.take();
            // A terminal wrapped the message in the middle of a word (`Failed to allo` / `cate`).
            // (A line continued with a backslash, `alread\` / `y allocated`, is glued without it.)
            let glued: String = lines[i..end]
                .iter()
                .map(|l| l.text.strip_suffix('\\').unwrap_or(&l.text))
                .collect();
            found = headline(&glued, lines[i].number, pat).map(|(piece, used)| {
                let mut len = 0;
                let mut n = 0;
                for l in &lines[i..end] {
                    n += 1;
                    len += l.text.len();
                    if len >= used {
                        break;
                    }
                }
                (piece, n)
            });
            let better = score(&found) > score(&fallback)
                || (torch_head(&fallback)
                    && matches!((&found, &fallback), (Some((Piece::Event(g), _)), Some((Piece::Event(f), _))) if g.figure_count() > f.figure_count()));
            if !better {
                found = fallback;
            }
        }
        if found.is_none()
            && heads
                .last()
                .is_none_or(|h| lines[i].number.saturating_sub(lines[h.0].number) > 300)
        {
            found = report_start(text, lines[i].number, pat).map(|piece| (piece, 1));
        }
        // A BFC `Stats:` block pasted without its `Stats:` line: `Limit: N` then `InUse: N`.
        // (From `InUse:` on only when no `Limit:` / `Stats:` line heads it: then it is that
        // block's.)
        let headed = i > 0 && {
            let prev = &lines[i - 1].text;
            prev.contains("Limit:") || prev.contains("Stats:")
        };
        if found.is_none()
            && !(headed && text.trim_start().starts_with("InUse:"))
            && bare_bfc_stats(text, lines.get(i + 1).map(|l| l.text.as_str()))
        {
            found = Some((
                Piece::AllocatorStats {
                    line: lines[i].number,
                    limit: None,
                    in_use: None,
                    largest_free: None,
                },
                1,
            ));
        }
        match found {
            Some((piece, used_lines)) => {
                heads.push((i, used_lines, piece));
                i += used_lines;
            }
            None => i += 1,
        }
    }
    let mut out = Vec::with_capacity(heads.len());
    for k in 0..heads.len() {
        let (start, used, _) = heads[k];
        let region_end = heads.get(k + 1).map_or(lines.len(), |h| h.0);
        let region = &lines[(start + used).min(region_end)..region_end];
        let head_line_text = &lines[start..start + used];
        let mut piece = heads[k].2.clone();
        match &mut piece {
            Piece::Event(event) => {
                read_report(event, head_line_text, region, pat);
                hints.apply(event);
                read_progress(event, &lines[..start], pat);
                read_stage(event, &lines[..start + used], region);
                hints.apply_stage(event);
                read_failing_op(event, &lines[..start + used], region);
            }
            Piece::AllocatorStats {
                limit,
                in_use,
                largest_free,
                ..
            } => {
                for line in head_line_text.iter().chain(region.iter().take(40)) {
                    let t = line.text.trim();
                    read_bfc_stat(t, limit, in_use, largest_free, pat);
                    if let Some(c) = pat.pool_limit.captures(t) {
                        *limit = limit
                            .or(size(&c, 1))
                            .or_else(|| c.get(2).and_then(|m| m.as_str().parse().ok()));
                    }
                }
            }
            Piece::Remat { .. } | Piece::Skip | Piece::Context { .. } | Piece::Warning { .. } => {}
        }
        if piece != Piece::Skip {
            out.push(piece);
        }
    }
    out
}

/// `Limit:                 10198757376` followed by `InUse: ...`: the first two lines of TF's BFC
/// statistics (printed only when an allocation failed), pasted without their `Stats:` line.
/// The same block pasted from its `InUse:` line on (`InUse: N` then `MaxInUse: N`).
fn bare_bfc_stats(text: &str, next: Option<&str>) -> bool {
    let t = text.trim_start();
    let (rest, then) = if let Some(rest) = t.strip_prefix("Limit:") {
        (rest, "InUse:")
    } else if let Some(rest) = t.strip_prefix("InUse:") {
        (rest, "MaxInUse:")
    } else {
        return false;
    };
    let digits = rest.trim();
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && next.is_some_and(|n| n.trim_start().starts_with(then))
}

/// Framework and backend clues in the whole block (tracebacks, paths, op names).
#[derive(Default)]
struct Hints {
    framework: Option<Framework>,
    tpu: bool,
    gpu: bool,
    program: Option<String>,
    pool_setting: Option<String>,
    /// `torch_xla` itself is named (not only a `torch/` path).
    torch_xla: bool,
    model_params: Option<u64>,
    param_bits: Option<u32>,
    accelerator: Option<String>,
    batch_tried: Option<String>,
    holder_named: Option<String>,
    growth_said: Option<String>,
    device_named_bytes: Option<u64>,
    devices_named: Option<u32>,
    structure_predictor: Option<String>,
    image_upscaler: Option<String>,
    vae_decode: Option<String>,
    /// The text shows an LLM serving or generation engine sizing its KV cache or context
    /// (`llama_new_context_with_model`, `n_ctx`, `KV self size`, `max_model_len`, a `.gguf`
    /// model): a failure with no traceback of its own is the engine's generation.
    serving: bool,
}

/// A protein structure predictor the text names, as its project spells it: in a path, a
/// package, a command or a sentence (`alphafold/model/modules.py`, `colabfold_batch`, `I am
/// running RoseTTAFold`, `esm.pretrained.esmfold_v1()`). Such a program folds one complex at a
/// time: its memory is the sequence length's, squared.
fn structure_predictor(t: &str) -> Option<String> {
    const NAMES: &[(&str, &str)] = &[
        ("alphafold", "AlphaFold"),
        ("colabfold", "ColabFold"),
        ("rosettafold", "RoseTTAFold"),
        ("omegafold", "OmegaFold"),
        ("esmfold", "ESMFold"),
        ("openfold", "OpenFold"),
        ("fastfold", "FastFold"),
        ("unifold", "Uni-Fold"),
        ("uni-fold", "Uni-Fold"),
        ("helixfold", "HelixFold"),
        ("protenix", "Protenix"),
        ("alphapulldown", "AlphaPulldown"),
        ("boltz-1", "Boltz"),
        ("boltz-2", "Boltz"),
        ("boltz predict", "Boltz"),
        ("boltz/", "Boltz"),
        ("chai_lab", "Chai-1"),
        ("chai-1", "Chai-1"),
    ];
    let quick = [
        "fold", "Fold", "FOLD", "boltz", "Boltz", "chai", "Chai", "protenix", "Protenix",
    ];
    named_program(t, &quick, NAMES)
}

/// An image upscaler or restorer the text names (`realesrgan/utils.py`, `SwinIR`, `GFPGAN`,
/// `waifu2x`, `super-resolution`): one image per call, its size the memory.
/// A diffusion model's VAE decoding latents to pixels, as a traceback frame or code line
/// (`vae.decode(`, `decode_first_stage`, `tiled_decode`, ComfyUI's `VAEDecode`) or a sentence
/// (`out of memory during decoding latents`, `in the video decoder step`, `VAE decode`): the
/// words as written.
fn vae_decode(t: &str) -> Option<String> {
    let l = t.to_ascii_lowercase();
    if !(l.contains("decod")) {
        return None;
    }
    const KEYS: &[&str] = &[
        "vae.decode",
        "vae_decode",
        "vaedecode",
        "decode_first_stage",
        "decode_latents",
        "decoding latents",
        "decoding the latents",
        "vae decod",
        "video decoder step",
    ];
    KEYS.iter()
        .find_map(|k| l.find(k).map(|i| t[i..].chars().take(60).collect()))
}

fn image_upscaler(t: &str) -> Option<String> {
    const NAMES: &[(&str, &str)] = &[
        ("realesrgan", "Real-ESRGAN"),
        ("real-esrgan", "Real-ESRGAN"),
        ("esrgan", "ESRGAN"),
        ("bsrgan", "BSRGAN"),
        ("swinir", "SwinIR"),
        ("gfpgan", "GFPGAN"),
        ("codeformer", "CodeFormer"),
        ("waifu2x", "waifu2x"),
        ("realcugan", "Real-CUGAN"),
        ("real-cugan", "Real-CUGAN"),
        ("stablesr", "StableSR"),
        ("supir", "SUPIR"),
        ("super-resolution", "a super-resolution model"),
        ("super resolution", "a super-resolution model"),
        ("superresolution", "a super-resolution model"),
        ("upscaler", "an upscaler"),
    ];
    let quick = [
        "esrgan",
        "ESRGAN",
        "SwinIR",
        "swinir",
        "GFPGAN",
        "gfpgan",
        "odeFormer",
        "odeformer",
        "waifu2x",
        "CUGAN",
        "cugan",
        "StableSR",
        "SUPIR",
        "esolution",
        "pscaler",
    ];
    named_program(t, &quick, NAMES)
}

/// The program a line names: the first of `names` (lowercase key, display name) it contains,
/// once one of the `quick` byte strings shows it may.
fn named_program(t: &str, quick: &[&str], names: &[(&str, &str)]) -> Option<String> {
    if !quick.iter().any(|k| t.contains(k)) {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    names
        .iter()
        .find(|(k, _)| lower.contains(k))
        .map(|(_, name)| (*name).to_string())
}

/// What `structure_predictor` holds when the text folds a protein without naming the program.
pub const GENERIC_STRUCTURE_PREDICTOR: &str = "protein structure prediction";

/// A protein's length in a sentence: a number of residues or amino acids (`~1,100 amino acid
/// long`, `912 AA`, `a peptide with 8 residues`).
fn protein_length_said(t: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !["amino", "residue", "AA", " aa"]
        .iter()
        .any(|k| t.contains(k))
    {
        return false;
    }
    RE.get_or_init(|| {
        Regex::new(r"\b\d[\d,.]*\s*(?:-?\s*long\s+)?(?:residues|amino[ -]acids?|AA|aa)\b")
            .expect("protein length pattern")
    })
    .is_match(t)
}

/// Words of an LLM inference engine sizing its context or KV cache.
fn serving_words(t: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    let quick = [
        "ctx",
        "KV",
        "kv",
        "model_len",
        "model-len",
        "input_len",
        "gguf",
        "ggml",
    ]
    .iter()
    .any(|k| t.contains(k));
    quick
        && RE
            .get_or_init(|| {
                Regex::new(r"llama_new_context|llm_load|\bn_ctx\b|KV self size|[Kk][Vv][ _-]?[Cc]ache|num_ctx|max_model_len|max-model-len|max_input_len|ctx[-_]size|\.gguf\b|\bggml|max_num_seqs")
                    .expect("valid built-in regex")
            })
            .is_match(t)
}

/// `line` with every path into a Python installation cut to its package
/// (`/opt/torch/.venv/lib/python3.12/site-packages/jax/_src/api.py` becomes `jax/_src/api.py`):
/// the directories above `site-packages/` (or `dist-packages/`) are the user's, and name no
/// framework even when one is called `torch` or `jax`.
fn installed_paths(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains("-packages/") {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = ["site-packages/", "dist-packages/"]
        .iter()
        .filter_map(|k| rest.find(k).map(|i| (i, k.len())))
        .min()
    {
        let (at, len) = i;
        // The path starts after the last separator before it (a space, a quote, a bracket).
        let start = rest[..at]
            .rfind(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | '[' | '=' | ','))
            .map_or(0, |j| j + 1);
        out.push_str(&rest[..start]);
        rest = &rest[at + len..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// Whether a path in `t` starts with `dir` (`torch/nn/modules/module.py`, `"torch/...`), not
/// one that only passes through a directory of that name.
fn starts_a_path(t: &str, dir: &str) -> bool {
    t.match_indices(dir).any(|(i, _)| {
        t[..i]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | '[' | '=' | ','))
    })
}

/// The user says something else holds the device: `GPU 0 is in use by another process`,
/// `another notebook was running`, `occupied by other processes`. The sentence, shortened.
fn holder_named(t: &str) -> Option<String> {
    // A program's own print of what PyTorch's caching allocator holds (`torch reserved after
    // preprocessing: 55.43 GiB`, `torch.cuda.memory_reserved(): 12.0 GB`): memory a failure
    // outside PyTorch's allocator (a CUDA call of Numba, CuPy, a library) could not have.
    // (explain ignores it for PyTorch's own allocator message, whose figures say it already.)
    if t.trim_start().starts_with("torch") && t.contains("reserved") {
        static TORCH_HELD: OnceLock<Regex> = OnceLock::new();
        let held = TORCH_HELD.get_or_init(|| {
            Regex::new(
                r"^\s*torch\S*\s[^\n]{0,40}?\breserved\b[^\n]{0,40}?\d+(?:\.\d+)?\s*[GT]i?B\b",
            )
            .expect("torch held pattern")
        });
        if held.is_match(t) {
            return Some(t.trim().chars().take(160).collect());
        }
    }
    // Cheap filter first: this runs on every line around an event.
    if ![
        "process",
        "notebook",
        "occupied",
        "in use",
        "used by",
        "nother",
        "releas",
        "被占用",
        "capacity",
        "fully used",
        "already used",
    ]
    .iter()
    .any(|k| t.contains(k))
    {
        return None;
    }
    let l = t.to_ascii_lowercase();
    let holder: Option<usize> = [
        "another process",
        "other process",
        "another notebook",
        "other notebook",
        "another job",
        "another program",
        "another application",
        "occupied by",
        "in use by",
        "used by another",
        // `One of the GPU's is at full capacity and the other is unused`: a card already full
        // before the program starts.
        "is at full capacity",
        "are at full capacity",
        "is fully used",
        "is already used",
        "is already in use",
        // Arrays of an earlier run in the same process (a notebook kernel, a loop of jobs):
        // the user says the memory is not given back.
        "didn't release",
        "doesn't release",
        "does not release",
        "did not release",
        "not released",
        "never released",
        // Chinese: "is occupied" (`如果它被占用就会导致这个错误`: if it is occupied, this error).
        "被占用",
    ]
    .iter()
    .filter_map(|k| l.find(k))
    .min();
    let at = holder?;
    // `72.48 GiB in use by this process`: the process itself, not another holder.
    if [
        "in use by this",
        "used by this",
        "occupied by this",
        "occupied by my",
        "in use by my",
    ]
    .iter()
    .any(|k| l[at..].starts_with(k))
    {
        return None;
    }
    let device = [
        "gpu", "memory", "device", "tpu", "card", "vram", "卡", "显存",
    ]
    .iter()
    .any(|k| l.contains(k));
    // Advice (`check that no other process ...`, `if another process holds it`) and questions
    // are not a statement: the conditional or the advice comes before what it qualifies.
    let advice = l.contains('?')
        || ["make sure", "check ", "if "]
            .iter()
            .any(|k| l[..at].contains(k));
    // A denial (`it's not running any other processes`, `no other process uses the GPU`) says
    // the opposite: within the few words before the holder.
    let mut from = at.saturating_sub(24);
    while !l.is_char_boundary(from) {
        from -= 1;
    }
    let near = &l[from..at];
    // (Only of another process or program: `doesn't free the memory occupied by the old
    // weights` denies the freeing, not the holder.)
    let other = l[at..].starts_with("another") || l[at..].starts_with("other");
    let denied = other
        && [" not ", "n't ", " no ", " nor ", "without "]
            .iter()
            .any(|k| near.contains(k));
    (device && !advice && !denied).then(|| t.trim().chars().take(160).collect())
}

/// The user says memory grew before the failure: a leak, a steady increase over epochs or
/// steps, or an OOM that came only after some epochs of training ran. The sentence, shortened.
fn growth_said(t: &str) -> Option<String> {
    // Said in Chinese (`显存一直缓慢增长直到oom`, `内存泄漏`, `显存不断增加`): a rising or leaking
    // word beside the memory it names, not asked (`？`) nor denied (`没有`, `不是`).
    if t.contains("增") || t.contains("泄") || t.contains("越来越") {
        let rising = |c: &str| {
            [
                "一直增",
                "缓慢增",
                "持续增",
                "不断增",
                "逐渐增",
                "逐步增",
                "慢慢增",
                "越来越大",
                "越来越多",
                "越来越高",
                "泄漏",
                "泄露",
            ]
            .iter()
            .any(|k| c.contains(k))
        };
        // The clause that says it (a question after it, `如何排查问题？`, is about the fix).
        let said = t
            .split(['，', '。', '；', ',', '！', '!'])
            .filter(|c| rising(c))
            .any(|c| {
                let memory = ["显存", "内存", "oom", "OOM"].iter().any(|k| c.contains(k));
                let asked =
                    c.contains('？') || c.contains('?') || c.contains("没有") || c.contains("不是");
                memory && !asked
            });
        if said {
            return Some(t.trim().chars().take(160).collect());
        }
    }
    // Cheap filter first: this runs on every line around an event.
    if ![
        "leak",
        "increas",
        "grow",
        "epoch",
        "Epoch",
        "models",
        "goes up",
        "rises",
        "climbs",
        "accumulat",
        "incremental",
        "a list",
        "steps",
        "iterations",
    ]
    .iter()
    .any(|k| t.contains(k))
    {
        return None;
    }
    let l = t.to_ascii_lowercase();
    // Advice, questions and denials are not a statement.
    let advice = [
        "make sure",
        "check ",
        "if ",
        "?",
        "no memory leak",
        "not a memory leak",
        "not a leak",
        "no leak",
        "avoid",
        "prevent",
        "fix",
    ]
    .iter()
    .any(|k| l.contains(k));
    if advice {
        return None;
    }
    let memory = ["memory", "gpu", "vram", "hbm", "ram", "oom"]
        .iter()
        .any(|k| l.contains(k));
    let leak = l.contains("memory leak") || l.contains("leaks memory") || l.contains("leaking");
    let rising = [
        "steady increase",
        "slow increase",
        "gradual increase",
        "constant increase",
        "keeps increasing",
        "kept increasing",
        "keep increasing",
        "keeps on increasing",
        "kept on increasing",
        "keeps on growing",
        "keeps growing",
        "kept growing",
        "keeps rising",
        "increases every",
        "increases each",
        "increases after each",
        "increasing every",
        "increasing each",
        "grows every",
        "grows each",
        "grows with each",
        "grows over",
    ]
    .iter()
    .any(|k| l.contains(k))
        // `After each validation batch the GPU memory consumption increases until nothing is
        // left`: a rising verb with a repetition word, in a sentence about memory.
        || (["increases", "grows", "goes up", "rises", "climbs", "accumulat", "incremental", "increment of"]
            .iter()
            .any(|k| l.contains(k))
            && ["each ", "every ", "until ", "over time", "steadily", "per step", "per epoch", "per batch", "constant"]
                .iter()
                .any(|k| l.contains(k)));
    // Outputs kept across batches in a Python list (`keeping a list of the model calls was
    // using unnecessary memory`): the classic way device memory accumulates.
    let kept_list = [
        "keeping a list",
        "kept a list",
        "keep a list",
        "appending the outputs",
        "appending outputs",
    ]
    .iter()
    .any(|k| l.contains(k));
    // Models built one after another in one process (Keras without clear_session): each adds
    // its graph and variables to what the process holds.
    let models_in_loop = [
        "several models",
        "multiple models",
        "many models",
        "models one after another",
        "models consecutively",
    ]
    .iter()
    .any(|k| l.contains(k))
        && ["loop", "one after another", "consecutive", "in a row"]
            .iter()
            .any(|k| l.contains(k));
    // `runs out of memory on epoch number 4`, `unable to train for more than ~2 epochs`,
    // `out of memory from training ... for 125 epochs`: training ran epochs before failing.
    let oom = l.contains("out of memory") || l.contains("oom");
    let after_epochs = oom && epochs_ran(&l).is_some_and(|n| n >= 2);
    // `crashed consistently after about 9k steps`, `out of memory when I run it up to about 1500
    // steps`: a thousand steps or more ran before the failure.
    let after_steps = oom && steps_ran(&l).is_some_and(|n| n >= 1000);
    ((leak || rising || kept_list) && memory || after_epochs || after_steps || models_in_loop)
        .then(|| t.trim().chars().take(160).collect())
}

/// Built-in patterns compiled once into `cell`.
fn built_in<const N: usize>(
    cell: &'static OnceLock<[Regex; N]>,
    patterns: [&str; N],
) -> &'static [Regex; N] {
    cell.get_or_init(|| patterns.map(|p| Regex::new(p).expect("valid built-in regex")))
}

/// The GPU's memory a line names: nvidia-smi's model names with their size (`Tesla
/// P100-PCIE-16GB`, `A100-SXM4-80GB`, `H100 80GB HBM3`), a size said with the GPU (`48 GB VRAM`,
/// `GPU with 24GB`, `12G GPU memory`), or a model whose size is fixed (`T4`, `V100`, `RTX 3090`;
/// A100 counts as its smaller 40 GB). Host RAM (`memory: 256G`) is not a GPU's.
fn gpu_named_bytes(t: &str) -> Option<u64> {
    static RES: OnceLock<[Regex; 3]> = OnceLock::new();
    // Cheap filter first (this runs on every line around an event): a size in G written after a
    // digit (`16GB`, `48 GB`, `12G`), or one of the fixed-size models' digits.
    let b = t.as_bytes();
    let g = |c: u8| (c | 0x20) == b'g';
    let sized = b.windows(2).any(|w| w[0].is_ascii_digit() && g(w[1]))
        || b.windows(3)
            .any(|w| w[0].is_ascii_digit() && w[1] == b' ' && g(w[2]));
    if !(sized
        || t.contains("T4")
        || t.contains("100")
        || t.contains("090")
        || t.contains("RTX")
        || t.contains("GTX")
        || t.contains("TITAN")
        || t.contains("Titan"))
    {
        return None;
    }
    let [named, said, model] = built_in(
        &RES,
        [
            r"\b(?:Tesla\s+|NVIDIA\s+)?[A-Z]{1,2}\d{2,4}[A-Za-z]*(?:-[A-Z0-9]+)*[- ](\d{1,3})GB\b",
            r"(?i)(?:\b(\d{1,3}(?:\.\d+)?)\s?(?:GB|GiB|G)\s+(?:of\s+)?(?:the\s+)?(?:memory\s+)?(?:GPU\s+memory|GPU\s+RAM|VRAM|GPU\b|graphics)|\bGPUs?\s+(?:has|have|with)\s+(?:over\s+|about\s+)?(\d{1,3}(?:\.\d+)?)\s?(?:GB|GiB|G)\b)",
            r"\b(T4|V100|A100|H100|H200|A10G|L4|K80|P100|A40|A6000|RTX\s?3090|RTX\s?4090)\b",
        ],
    );
    const GIB: f64 = (1u64 << 30) as f64;
    let gb = |s: &str| s.parse::<f64>().ok().map(|g| (g * GIB) as u64);
    if let Some(c) = named.captures(t) {
        return gb(&c[1]);
    }
    if let Some(c) = said.captures(t) {
        return c.get(1).or(c.get(2)).and_then(|m| gb(m.as_str()));
    }
    if let Some(g) = geforce_gib(t) {
        return Some((g * GIB) as u64);
    }
    let m = model.captures(t)?;
    let g = match m[1].replace(' ', "").as_str() {
        "T4" | "V100" | "P100" => 16.0,
        "A100" | "A40" | "A6000" => 40.0,
        "H100" => 80.0,
        "H200" => 141.0,
        "A10G" | "L4" | "RTX3090" | "RTX4090" => 24.0,
        "K80" => 12.0,
        _ => return None,
    };
    Some((g * GIB) as u64)
}

/// How many devices a line says the run uses, when more than one: a count with the card
/// (`4x A100`, `2x 7900 xtx`, `A100/40G × 4`, `V100 x 8`, `8 GPUs`, `two GPUs`), a parallelism
/// setting (`tp=4`, `--tensor-parallel-size 2`, `--nproc_per_node=8`, `--num_gpus 4`), or
/// `两张12G显卡` (two 12G cards).
fn devices_named(t: &str) -> Option<u32> {
    static RES: OnceLock<[Regex; 4]> = OnceLock::new();
    let quick = t.bytes().any(|c| c.is_ascii_digit())
        || [
            "two", "Two", "three", "four", "eight", "两", "二", "三", "四", "八",
        ]
        .iter()
        .any(|w| t.contains(w));
    if !quick {
        return None;
    }
    let [before, after, setting, chinese] = built_in(
        &RES,
        [
            r"(?i)(?:^|[\s(,:])(\d{1,2}|two|three|four|eight)\s*(?:[x×*]\s*)?(?:nvidia\s+|tesla\s+|geforce\s+|amd\s+|radeon\s+)?(?:(?:rtx|gtx|rx)\s*)?(?:(?:[a-wyz]|[a-z]{2})\d{1,4}[a-z]{0,2}\b|(?:[1-5]0[5-9]0|[67]900)(?:\s*(?:ti|xtx|xt))?\b|gpus\b|cards\b|graphics\s+cards\b)",
            r"(?i)\b(?:[a-z]{1,2}\d{2,4}[a-z]{0,2}|gpus?|cards?)(?:\s*[/-]\s*\d{1,3}\s*gb?)?\s*[x×*]\s*(\d{1,2})\b",
            r"(?i)(?:\btp|tensor[_-]parallel[_-]size|nproc[_-]per[_-]node|num[_-]gpus|n[_-]gpus|--gpus)\s*[=: ]\s*(\d{1,2})\b",
            r"([两二三四八]|\d{1,2})\s*(?:张|块)[^\s，。,]{0,8}?(?:显卡|卡|GPU)",
        ],
    );
    let word = |w: &str| match w.to_ascii_lowercase().as_str() {
        "two" | "两" | "二" => Some(2),
        "three" | "三" => Some(3),
        "four" | "四" => Some(4),
        "eight" | "八" => Some(8),
        n => n.parse::<u32>().ok(),
    };
    // A count with the card needs the `x` or a plural (`4x A100`, `8 GPUs`): `2 3090s`, not
    // `3 4090`, which is a list of numbers.
    let counted = before.captures_iter(t).find_map(|c| {
        let whole = c.get(0)?.as_str().to_ascii_lowercase();
        let multiplied = whole.contains('x') && {
            let n = c.get(1)?.as_str();
            let rest = whole.trim_start_matches(|ch: char| !ch.is_ascii_alphanumeric());
            rest.strip_prefix(&n.to_ascii_lowercase())
                .is_some_and(|r| r.trim_start().starts_with(['x', '×', '*']))
        } || whole.contains('×')
            || whole.contains('*');
        let plural = whole.ends_with("gpus") || whole.ends_with("cards");
        (multiplied || plural)
            .then(|| word(c.get(1)?.as_str()))
            .flatten()
    });
    let n = counted
        .or_else(|| after.captures(t).and_then(|c| word(&c[1])))
        .or_else(|| setting.captures(t).and_then(|c| word(&c[1])))
        .or_else(|| chinese.captures(t).and_then(|c| word(&c[1])))?;
    (2..=64).contains(&n).then_some(n)
}

/// The memory of a GeForce / TITAN card the line names (`GeForce RTX 2080 Ti`, `GTX 1050`, `RTX
/// 3060`), in GiB: their memory is fixed by the model (the common size where a model came in two).
fn geforce_gib(t: &str) -> Option<f64> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(
            r"\b(?:(RTX|GTX)[\s-]?(\d{3,4})([\s-]?(?:Ti|TI|ti))?|(TITAN|Titan)\s(X|Xp|V|RTX))\b",
        )
        .expect("valid built-in regex")
    });
    let c = re.captures(t)?;
    if c.get(4).is_some() {
        return Some(if &c[5] == "RTX" { 24.0 } else { 12.0 });
    }
    let ti = c.get(3).is_some();
    Some(match (&c[2], ti) {
        ("1050", false) => 2.0,
        ("1050", true) | ("1650", _) => 4.0,
        ("1060", _) | ("1660", _) | ("2060", false) => 6.0,
        ("1070", _)
        | ("1080", false)
        | ("2070", _)
        | ("2080", false)
        | ("3060", true)
        | ("3070", _)
        | ("4060", _) => 8.0,
        ("1080", true) | ("2080", true) => 11.0,
        ("3080", false) => 10.0,
        ("2060", true) | ("3060", false) | ("3080", true) | ("4070", _) => 12.0,
        ("4080", _) => 16.0,
        ("3090", _) | ("4090", _) => 24.0,
        ("5090", _) => 32.0,
        _ => return None,
    })
}

/// The framework's own start-up line shows the GPU already mostly taken: TensorFlow creates its
/// device with the memory free when the process starts (`Created device
/// /job:localhost/replica:0/task:0/device:GPU:0 with 1491 MB memory:  -> device: 0, name: NVIDIA
/// GeForce RTX 2080 Ti`, an 11 GB card), and TF 1.x prints the driver's figures (`totalMemory:
/// 10.91GiB freeMemory: 1.47GiB`). Less than half of the card free before the program allocated
/// anything: another process holds the rest.
fn device_taken_at_start(t: &str) -> Option<String> {
    static RES: OnceLock<[Regex; 2]> = OnceLock::new();
    if !(t.contains(" MB memory") || t.contains("freeMemory")) {
        return None;
    }
    let [created, driver] = RES.get_or_init(|| {
        [
            Regex::new(r"with (\d+) MB memory\)?:?\s*->\s*(?:physical GPU \()?device:\s*\d+,\s*name:\s*([^,]+)")
                .expect("valid built-in regex"),
            Regex::new(r"totalMemory:\s*(\d[\d.]*\s*[KMGT]iB)\s+freeMemory:\s*(\d[\d.]*\s*[KMGT]iB)")
                .expect("valid built-in regex"),
        ]
    });
    if let Some(c) = created.captures(t) {
        let mb: u64 = c[1].parse().ok()?;
        let card = gpu_named_bytes(&c[2])?;
        return (mb.saturating_mul(1 << 20).saturating_mul(2) < card).then(|| {
            format!(
                "the framework created its GPU device with only {mb} MB of the {}'s memory: the rest was held before it started",
                c[2].trim()
            )
        });
    }
    let c = driver.captures(t)?;
    let (total, free) = (parse_size(&c[1])?, parse_size(&c[2])?);
    (free.saturating_mul(2) < total).then(|| {
        format!(
            "the driver showed {} free of {} when the program started: the rest was already held",
            c[2].trim(),
            c[1].trim()
        )
    })
}

/// The epoch number a sentence names: `125 epochs`, `~2 epochs`, `epoch 4`, `epoch number 4`.
/// Training steps a sentence says ran (`after about 9k steps`, `up to 1500 iterations`).
fn steps_ran(l: &str) -> Option<u64> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !l.contains("steps") && !l.contains("iterations") && !l.contains("iters") {
        return None;
    }
    let c = RE
        .get_or_init(|| {
            Regex::new(r"\b(\d[\d,]*)\s*(k)?\s+(?:training\s+)?(?:steps|iterations|iters)\b")
                .expect("steps pattern")
        })
        .captures(l)?;
    let n: u64 = c[1].replace(',', "").parse().ok()?;
    Some(if c.get(2).is_some() { n * 1000 } else { n })
}

fn epochs_ran(l: &str) -> Option<u32> {
    let i = l.find("epoch")?;
    // `the 23th epoch`, `3rd epoch`: the ordinal's digits.
    let before = l[..i].trim_end();
    let before = ["st", "nd", "rd", "th"]
        .iter()
        .find_map(|o| {
            before
                .strip_suffix(o)
                .filter(|b| b.ends_with(|c: char| c.is_ascii_digit()))
        })
        .unwrap_or(before);
    let digits_before: String = before
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if let Ok(n) = digits_before.parse() {
        return Some(n);
    }
    let after = l[i + "epoch".len()..].trim_start_matches('s').trim_start();
    let after = after.strip_prefix("number").unwrap_or(after).trim_start();
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether a line names TensorFlow itself, not XLA's sources that live in its tree: libtpu and
/// jaxlib print `third_party/tensorflow/compiler/xla/...` and `.../tensorflow/tsl/...` paths
/// whatever framework drives them.
fn names_tensorflow(t: &str) -> bool {
    t.match_indices("tensorflow").any(|(i, _)| {
        let after = &t[i + "tensorflow".len()..];
        !(after.starts_with("/compiler/xla")
            || after.starts_with("/tsl")
            || after.starts_with("/core/tpu")
            || t[..i].ends_with("external/org_"))
    })
}

/// Whether a line names a TPU: `TPU`, `libtpu`, `tpu_worker`, `/tpu:0`, but not the `tpu` inside
/// `output`.
/// An environment block's PyTorch line: `PyTorch version: 2.5.1+cu124`, `torch 2.1.1`,
/// `torch==2.0.1`, `- torch: 2.3.0` (not `torchvision 0.16`).
fn torch_version_line(t: &str) -> bool {
    let l = t.trim_start_matches([' ', '-', '*', '`']);
    if l.starts_with("PyTorch version") {
        return true;
    }
    let Some(rest) = l.strip_prefix("torch") else {
        return false;
    };
    let version = rest.trim_start_matches([' ', '\t', ':', '=']);
    version.len() < rest.len() && version.starts_with(|c: char| c.is_ascii_digit())
}

fn mentions_tpu(t: &str) -> bool {
    if t.contains("TPU") {
        return true;
    }
    // accelerate's config dump lists its TPU keys on every machine (`tpu_env: []`,
    // `tpu_use_cluster: false`): an unset key is no TPU.
    let l = t.trim();
    if l.starts_with("tpu_")
        && [": false", ": []", ": null", ": None", ":"]
            .iter()
            .any(|v| l.ends_with(v))
    {
        return false;
    }
    let b = t.as_bytes();
    let mut from = 0;
    while let Some(i) = t[from..].find("tpu") {
        let at = from + i;
        let before = if at == 0 { b' ' } else { b[at - 1] };
        let after = b.get(at + 3).copied().unwrap_or(b' ');
        let word_before = !before.is_ascii_alphabetic() || t[..at].ends_with("lib");
        let word_after = !after.is_ascii_alphabetic() || after == b'v';
        if word_before && word_after {
            return true;
        }
        from = at + 3;
    }
    false
}

/// Settings that cap an allocator's pool, as users and logs write them.
const POOL_SETTINGS: &[&str] = &[
    "gpu_memory_utilization",
    "gpu-memory-utilization",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "per_process_gpu_memory_fraction",
    "xla_tpu_max_hbm_size_mib",
    "set_per_process_memory_fraction",
    // Unified memory lets the pool exceed the GPU, up to the fraction times its memory.
    "TF_FORCE_UNIFIED_MEMORY",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    // Serving engines' static KV-cache pools: SGLang, TensorRT-LLM, lmdeploy (TurboMind),
    // text-generation-inference.
    "mem_fraction_static",
    "mem-fraction-static",
    "free_gpu_memory_fraction",
    "kv_cache_free_gpu_mem_fraction",
    "cache_max_entry_count",
    "cuda-memory-fraction",
    "CUDA_MEMORY_FRACTION",
];

/// `gpu_memory_utilization=0.93` or `gpu-memory-utilization value from 0.93`: the setting with
/// the first number after it, if any.
fn pool_setting(t: &str) -> Option<String> {
    let (i, k) = POOL_SETTINGS
        .iter()
        .find_map(|k| t.find(k).map(|i| (i, *k)))?;
    let rest = &t[i + k.len()..];
    // `=0.93`, `"] = "false"`, ` value from 0.93 to 0.83`: the first number or boolean nearby.
    fn word(w: &str) -> &str {
        w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '.')
    }
    let value = rest
        .split(|c: char| c.is_whitespace() || c == '=' || c == ':')
        .take(5)
        .map(word)
        .find(|w| {
            !w.is_empty()
                && (w.chars().next().is_some_and(|c| c.is_ascii_digit())
                    || matches!(w.to_ascii_lowercase().as_str(), "true" | "false"))
        });
    Some(match value {
        Some(v) => format!("{k}={}", v.to_ascii_lowercase()),
        None => k.to_string(),
    })
}

/// Splits a line into words at spaces, quotes, brackets and path separators.
fn words(t: &str) -> impl Iterator<Item = &str> {
    t.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '/' | '"'
                    | '\''
                    | '`'
                    | '('
                    | ')'
                    | ','
                    | ':'
                    | '='
                    | '['
                    | ']'
                    | '{'
                    | '}'
                    | '<'
                    | '>'
            )
    })
    .filter(|w| !w.is_empty())
}

/// `7B`, `2.7b`, `13B`: a parameter count in billions, as model names write it.
fn billions(part: &str) -> Option<u64> {
    let num = part.strip_suffix(['b', 'B'])?;
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty()
        || int.len() > 3
        || frac.len() > 2
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    (0.1..=2000.0)
        .contains(&v)
        .then(|| (v * 1e9).round() as u64)
}

/// The parameter count a model name or a sentence states: `mistralai/Mistral-7B-v0.1`,
/// `EleutherAI/gpt-neo-2.7B`, `Llama-2-13b-hf`, `a 7B model`, `7 billion parameters`.
fn model_params(t: &str) -> Option<u64> {
    // Cheap filter first: a digit before `b`/`B`, or `billion`.
    let b = t.as_bytes();
    if !b
        .windows(2)
        .any(|w| w[0].is_ascii_digit() && (w[1] | 0x20) == b'b')
        && !t.contains("billion")
        && !t.contains("aram")
    {
        return None;
    }
    let ws: Vec<&str> = words(t)
        .filter(|w| w.bytes().any(|b| b.is_ascii_alphanumeric()))
        .collect();
    // `~6`, `**Params**`: markdown and approximation marks around a word.
    let bare = |w: &str| -> String {
        w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '.')
            .trim_end_matches('.')
            .to_ascii_lowercase()
    };
    // A count written as one word (`6B`) or two (`6 B`, `6 billion`) at word `i`.
    let count_at = |i: usize| -> Option<u64> {
        let w = bare(ws.get(i)?);
        if let Some(n) = billions(&w) {
            return Some(n);
        }
        let unit = bare(ws.get(i + 1)?);
        if unit == "b" || unit == "billion" {
            return billions(&format!("{w}b"));
        }
        None
    };
    // Model families users name with the size as the next word (`llama 7b`, `Gemma 2B`).
    const MODEL_FAMILIES: &[&str] = &[
        "llama",
        "llama2",
        "llama3",
        "mistral",
        "mixtral",
        "gemma",
        "gemma2",
        "gemma3",
        "qwen",
        "qwen2",
        "qwen3",
        "falcon",
        "bloom",
        "opt",
        "gpt-j",
        "gptj",
        "gpt-neox",
        "pythia",
        "phi",
        "deepseek",
        "t5",
        "mt5",
        "olmo",
        "yi",
        "baichuan",
        "vicuna",
        "alpaca",
        "starcoder",
    ];
    for (i, w) in ws.iter().enumerate() {
        if MODEL_FAMILIES.contains(&bare(w).as_str()) {
            if let Some(n) = ws.get(i + 1).and_then(|n| billions(&bare(n))) {
                return Some(n);
            }
        }
        // `Params: ~6 B`, `parameters: 6.7B`; `6 B params`, `6 billion parameters`.
        let lw = bare(w);
        if matches!(lw.as_str(), "params" | "parameters" | "param") {
            if let Some(n) = count_at(i + 1) {
                return Some(n);
            }
        }
        if lw == "b" || lw == "billion" {
            let is_param = ws
                .get(i + 1)
                .is_some_and(|n| bare(n).starts_with("param") || bare(n) == "model");
            if is_param && i > 0 {
                if let Some(n) = count_at(i - 1) {
                    return Some(n);
                }
            }
        }
        // A part of a hyphenated or underscored name, after a part with a letter.
        let parts: Vec<&str> = w.split(['-', '_']).collect();
        for k in 1..parts.len() {
            if parts[..k]
                .iter()
                .any(|p| p.bytes().any(|b| b.is_ascii_alphabetic()))
            {
                if let Some(n) = billions(parts[k]) {
                    return Some(n);
                }
            }
        }
        // `7B model`, `7B parameters`, `7 billion parameters`.
        let next = ws.get(i + 1).map(|n| n.to_ascii_lowercase());
        let next_is = |p: &[&str]| {
            next.as_deref()
                .is_some_and(|n| p.iter().any(|x| n.starts_with(x)))
        };
        if next_is(&["model", "param"]) {
            if let Some(n) = billions(w) {
                return Some(n);
            }
        }
        if next.as_deref() == Some("billion")
            && ws
                .get(i + 2)
                .is_some_and(|n| n.to_ascii_lowercase().starts_with("param"))
        {
            if let Ok(v) = w.parse::<f64>() {
                if (0.1..=2000.0).contains(&v) {
                    return Some((v * 1e9).round() as u64);
                }
            }
        }
    }
    None
}

/// Bits per weight the text sets: quantization first (it wins over a compute dtype on the same
/// line), then 16-bit and 32-bit dtypes.
fn param_bits(t: &str) -> Option<u32> {
    if !t.bytes().any(|c| {
        matches!(
            c,
            b'1' | b'3' | b'4' | b'8' | b'h' | b'H' | b'q' | b'Q' | b'w' | b'W'
        )
    }) {
        return None;
    }
    let l = t.to_ascii_lowercase();
    if let Some(b) = quantized_bits(&l) {
        return Some(b);
    }
    let has = |ks: &[&str]| ks.iter().any(|k| l.contains(k));
    if has(&[
        "load_in_4bit",
        "4bit",
        "4-bit",
        "awq",
        "gptq",
        "int4",
        "nf4",
    ]) {
        Some(4)
    } else if has(&["load_in_8bit", "8bit", "8-bit", "int8"]) {
        Some(8)
    } else if has(&["float16", "fp16", "bf16", "bfloat16"])
        || (l.contains("dtype") && l.contains("half"))
    {
        Some(16)
    } else if has(&["float32", "fp32"]) {
        Some(32)
    } else {
        None
    }
}

/// The bits per weight a quantized model's own name states: llama.cpp's GGML/GGUF types
/// (`q8_0`, `Q4_K_M`, `IQ3_XS`), ExLlamaV2's bits per weight (`3.0bpw`, `4.65bpw`, rounded up),
/// or a weight/activation scheme (`W4A16`, `w8a8`); FP8 is 8. `l` is lower-cased. The
/// contract's `param_bits` takes 4, 8, 16 or 32: up to 4 bits counts as 4, up to 8 as 8.
fn quantized_bits(l: &str) -> Option<u32> {
    quantized_bits_exact(l).map(|b| if b <= 4 { 4 } else { 8 })
}

fn quantized_bits_exact(l: &str) -> Option<u32> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !(l.contains('q') || l.contains("bpw") || l.contains('w') || l.contains("fp8")) {
        return None;
    }
    let re = RE.get_or_init(|| {
        Regex::new(r"(?:^|[^a-z0-9])i?q([1-8])_(?:0|1|k|xs|xxs|s|m|nl)|(\d(?:\.\d+)?)\s?-?bpw\b|\bw([48])a(?:8|16)\b|\b(fp8)\b")
            .expect("quantized bits pattern")
    });
    let c = re.captures(l)?;
    if let Some(q) = c.get(1).or(c.get(3)) {
        return q.as_str().parse().ok();
    }
    if let Some(b) = c.get(2) {
        let b: f64 = b.as_str().parse().ok()?;
        return (b > 0.0 && b <= 16.0).then(|| b.ceil() as u32);
    }
    c.get(4).map(|_| 8)
}

/// A TPU named with its generation: `v3-8`, `v2-8`, `v4-32`, `v5litepod-16`, `v5e`, `v6e-8`,
/// `v5p-128`, as written.
fn tpu_named(t: &str) -> Option<String> {
    if !t
        .as_bytes()
        .windows(2)
        .any(|w| (w[0] | 0x20) == b'v' && w[1].is_ascii_digit())
    {
        return None;
    }
    words(t).find_map(|w| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        let l = w.to_ascii_lowercase();
        let l = l.strip_prefix("tpu-").unwrap_or(&l);
        let gen = ["v5litepod", "v2", "v3", "v4", "v5e", "v5p", "v6e"]
            .into_iter()
            .find(|g| l.starts_with(g))?;
        let rest = &l[gen.len()..];
        // `v2.8 TPU`: a dot for the dash, only beside the word TPU (`v2.8` alone is a version).
        let sep: &[char] = if mentions_tpu(t) { &['-', '.'] } else { &['-'] };
        let ok = rest.is_empty()
            || rest
                .strip_prefix(sep)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        // `v2`/`v3`/`v4` alone are too common (versions): they need a slice size.
        (ok && (!rest.is_empty() || gen.len() > 2)).then(|| l.replacen('.', "-", 1))
    })
}

/// The user says a smaller batch was tried and still failed: `even with batch size 1`, `I tried
/// reducing the batch size`, `batch_size=1 still OOMs`. The sentence, shortened.
fn batch_tried(t: &str) -> Option<String> {
    if !t.contains("atch") && !t.contains("ATCH") {
        return None;
    }
    let l = t.to_ascii_lowercase();
    let b = l.find("batch")?;
    let around = |ks: &[&str]| ks.iter().any(|k| l.contains(k));
    let tried = around(&[
        "tried reduc",
        "tried editing",
        "tried changing",
        "tried lower",
        "tried decreas",
        "tried smaller",
        "tried to reduce",
        "tried to lower",
        "tried to decrease",
        "tried using a smaller",
        "trying to reduce",
        "reducing the batch",
        "reduced the batch",
        "lowered the batch",
        "decreased the batch",
        "reducing batch",
        "reduced batch",
        "lowering the batch",
        "decreasing the batch",
        "even with batch",
        "even with a batch",
        "even at batch",
        "even for batch",
        "even with the batch",
        "even batch size",
        "even a batch",
    ]) || ({
        // `I played with a batch_size, but nothing helped`: the batch and a failure in one
        // sentence.
        [
            "nothing helped",
            "nothing helps",
            "didn't help",
            "did not help",
            "doesn't help",
            "does not help",
            "no luck",
            "still fails",
            "still failed",
            "still get",
            "still got",
            "still the same",
            "still no solution",
            "still not work",
            "still doesn't work",
            "still does not work",
            "same error",
            "error persists",
        ]
        .iter()
        .any(|k| l.contains(k))
    }) || {
        // `I reduced a lot of options such as batch size`: a past-tense cut shortly before it.
        let mut from = b.saturating_sub(48);
        while !l.is_char_boundary(from) {
            from -= 1;
        }
        let before = &l[from..b];
        ["reduced ", "lowered ", "decreased ", "cut ", "shrunk "]
            .iter()
            .any(|v| before.contains(v))
            && !before.contains("if ")
    };
    let one = {
        // `batch size of 1`, `batch_size=1`, `batch size 1` followed by a failure word.
        let rest = &l[b..];
        let r: String = rest.chars().take(30).collect();
        (r.contains(" 1 ")
            || r.contains("=1")
            || r.contains(" 1,")
            || r.contains(" 1.")
            || r.ends_with(" 1")
            || r.contains("of 1"))
            && around(&[
                "still",
                "even",
                "same error",
                "doesn't help",
                "does not help",
                "didn't help",
                "did not help",
            ])
    };
    // A run at a batch of one that failed (`batch_size=1` in a failure report): the batch cannot
    // be halved; not an evaluation's or a test's batch, not one that worked.
    let one_stated = {
        let r = &l[b..];
        ((r.starts_with("batch_size=1") && !r[12..].starts_with(|c: char| c.is_ascii_digit()))
            || r.starts_with("batch size of 1 "))
            && !["eval", "val_", "valid", "test", "infer", "predict"]
                .iter()
                .any(|k| l[..b].contains(k))
            && !["work", "fine", "fit", "ok"]
                .iter()
                .any(|k| r.chars().take(40).collect::<String>().contains(k))
    };
    // `... and it worked`: the batch was the fix, not a dead end.
    let solved = [
        "it worked",
        "that worked",
        "this worked",
        "works now",
        "solved",
        "fixed it",
        "make it work",
        "makes it work",
        "work by",
        "works by",
        "works with",
        "it works",
    ]
    .iter()
    .any(|k| l.contains(k))
        // `could be able to train`, `was able to run it` (not `not able to`, `unable to`).
        || l.match_indices("able to").any(|(i, _)| {
            let before = &l[..i];
            !(before.ends_with("un")
                || before.ends_with("not ")
                || before.ends_with("n't ")
                || before.ends_with("never "))
        });
    // A batch that still fails but is itself large (`reduced batch_size to 256`) rules
    // nothing out: halving it further is still the first thing to do.
    let still_large = l[b..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .take(2)
        .filter_map(|n| n.parse::<u64>().ok())
        .any(|n| (32..=1 << 20).contains(&n));
    (!solved && ((!still_large && (tried || one)) || one_stated)).then(|| {
        let s: String = t.trim().chars().take(160).collect();
        s
    })
}

impl Hints {
    fn of(lines: &[Line]) -> Hints {
        let mut h = Hints::default();
        let (mut jax, mut ptxla, mut tf, mut tf_strong) = (false, false, false, false);
        // PyTorch named only by an environment block (`PyTorch version: 2.5.1+cu124`, `torch
        // 2.1.1`, `torch==2.0.1`): the weakest sign, after every other framework's.
        let mut torch_env = false;
        // A protein's length (`~1,100 amino acids`, `912 AA`, `8 residues`) and folding words
        // (`monomer`, `structure`, `fold`) in the same text: a structure prediction, whatever
        // the program's name.
        let (mut protein_length, mut folding) = (false, false);
        for line in lines {
            let t = &*installed_paths(&line.text);
            h.serving |= serving_words(t);
            protein_length |= protein_length_said(t);
            folding |= [
                "fold",
                "Fold",
                "structure",
                "monomer",
                "multimer",
                "complex",
            ]
            .iter()
            .any(|k| t.contains(k));
            if t.contains("torch_xla")
                || t.contains("Bad StatusOr access")
                || t.contains("PT_XLA")
                || t.contains("xla_util.cc")
                || t.contains("SyncTensorsGraph")
                || t.contains("pytorch/xla")
                // A path into the torch package (`site-packages/torch/`), not a directory that
                // happens to be named `torch` (`/opt/torch/.venv/...`).
                || starts_a_path(t, "torch/")
            {
                ptxla = true;
            }
            if t.contains("torch_xla") || t.contains("PT_XLA") || t.contains("pytorch/xla") {
                h.torch_xla = true;
            }
            if !torch_env {
                torch_env = torch_version_line(t);
            }
            if t.contains("jax")
                || t.contains("XlaRuntimeError")
                || t.contains("JaxRuntimeError")
                || t.contains("jit(")
                || t.contains("flax")
                || t.contains("pjit")
                || t.contains("XLA_PYTHON_CLIENT")
                // jaxlib (before 0.4.14) built TensorFlow's sources in: its log lines name
                // `external/org_tensorflow/...`, which TensorFlow's own never do.
                || t.contains("external/org_tensorflow/")
            {
                jax = true;
            }
            if t.contains("tensorflow/python")
                || t.contains("tensorflow.python")
                || t.contains("ResourceExhaustedError")
                || t.contains("OOM when allocating")
                || t.contains("import tensorflow")
            {
                tf_strong = true;
            }
            if names_tensorflow(t)
                || t.contains("ResourceExhaustedError")
                || t.contains("function_node")
                || t.contains("OOM when allocating")
                || t.contains("tf.")
            {
                tf = true;
            }
            if mentions_tpu(t) || t.contains(" hbm") || t.contains("HBM") || t.contains(":T(") {
                h.tpu = true;
            }
            if t.contains("GPU")
                || t.contains("cuda")
                || t.contains("CUDA")
                // vLLM's `gpu_memory_utilization` option is set on TPUs too.
                || (t.contains("gpu_") && t.replace("gpu_memory_utilization", "").contains("gpu_"))
                || t.contains("NVIDIA")
            {
                h.gpu = true;
            }
            if h.pool_setting.is_none() {
                h.pool_setting = pool_setting(t);
            }
            if h.model_params.is_none() {
                h.model_params = model_params(t);
            }
            if h.param_bits.is_none() {
                h.param_bits = param_bits(t);
            }
            if h.accelerator.is_none() {
                h.accelerator = tpu_named(t);
            }
            if h.batch_tried.is_none() {
                h.batch_tried = batch_tried(t);
            }
            if h.holder_named.is_none() {
                h.holder_named = holder_named(t).or_else(|| device_taken_at_start(t));
            }
            if h.growth_said.is_none() {
                h.growth_said = growth_said(t);
            }
            if h.device_named_bytes.is_none() {
                h.device_named_bytes = gpu_named_bytes(t);
            }
            if h.devices_named.is_none() {
                h.devices_named = devices_named(t);
            }
            if h.structure_predictor.is_none() {
                h.structure_predictor = structure_predictor(t);
            }
            if h.image_upscaler.is_none() {
                h.image_upscaler = image_upscaler(t);
            }
            if h.vae_decode.is_none() {
                h.vae_decode = vae_decode(t);
            }
            if h.program.is_none() {
                if let Some(c) = p().exec_name.captures(t) {
                    h.program = Some(c[1].to_string());
                }
            }
        }
        if h.structure_predictor.is_none() && protein_length && folding {
            h.structure_predictor = Some(GENERIC_STRUCTURE_PREDICTOR.into());
        }
        h.framework = if ptxla {
            Some(Framework::PytorchXla)
        } else if jax && !tf_strong {
            Some(Framework::Jax)
        } else if tf {
            Some(Framework::Tensorflow)
        } else if torch_env {
            Some(Framework::PytorchXla)
        } else {
            None
        };
        h
    }

    /// After the traceback was read: a stage the text around the failure implies, where no
    /// frame named one.
    fn apply_stage(&self, event: &mut Event) {
        // A serving engine sizing its KV cache fails as it starts, before any request (vLLM's
        // `No available memory for the cache blocks`, `max seq len ... larger than the KV
        // cache`); SGLang's `Decode out of memory` comes while generating.
        if event.family == Family::VllmKvCache
            && !event.message.contains("ecode")
            && !event.message.contains("prefill")
            && matches!(event.stage, None | Some(Stage::Generation))
        {
            event.stage = Some(Stage::Init);
            return;
        }
        if self.serving && event.stage.is_none() && event.phase == Phase::Runtime {
            event.stage = Some(Stage::Generation);
        }
    }

    fn apply(&self, event: &mut Event) {
        if event.framework.is_none() {
            event.framework = self.framework;
        }
        // PyTorch's own message inside a PyTorch/XLA program.
        if event.framework == Some(Framework::Pytorch) && self.torch_xla {
            event.framework = Some(Framework::PytorchXla);
        }
        if event.backend.is_none()
            && !self.tpu
            && matches!(event.family, Family::GpuOomAllocate | Family::BfcAllocator)
            && event.memory_space != Some(MemorySpace::Host)
        {
            event.backend = Some(Backend::Gpu);
        }
        if event.backend.is_none() {
            event.backend = if self.tpu && !self.gpu {
                Some(Backend::Tpu)
            } else if self.gpu && !self.tpu {
                Some(Backend::Gpu)
            } else {
                None
            };
        }
        if event.program.is_none() {
            event.program.clone_from(&self.program);
        }
        if event.pool_setting.is_none() {
            event.pool_setting.clone_from(&self.pool_setting);
        }
        if event.model_params.is_none() {
            event.model_params = self.model_params;
        }
        if event.param_bits.is_none() {
            event.param_bits = self.param_bits;
        }
        if event.accelerator.is_none() {
            event.accelerator.clone_from(&self.accelerator);
        }
        if event.holder_named.is_none() {
            event.holder_named.clone_from(&self.holder_named);
        }
        if event.growth_said.is_none() {
            event.growth_said.clone_from(&self.growth_said);
        }
        if event.device_named_bytes.is_none() {
            event.device_named_bytes = self.device_named_bytes;
        }
        if event.devices_named.is_none() {
            event.devices_named = self.devices_named;
        }
        if event.structure_predictor.is_none() {
            event
                .structure_predictor
                .clone_from(&self.structure_predictor);
        }
        if event.image_upscaler.is_none() {
            event.image_upscaler.clone_from(&self.image_upscaler);
        }
        if event.vae_decode.is_none() {
            event.vae_decode.clone_from(&self.vae_decode);
        }
        if event.batch_tried.is_none() {
            event.batch_tried.clone_from(&self.batch_tried);
        }
        if event.memory_space.is_none() {
            event.memory_space = match event.backend {
                Some(Backend::Tpu) => Some(MemorySpace::Hbm),
                Some(Backend::Gpu) => Some(MemorySpace::Device),
                _ => None,
            };
        }
    }
}

pub(crate) fn new_event(line: u64, family: Family, phase: Phase, message: &str) -> Event {
    Event {
        line,
        family,
        phase,
        // `--xla_tpu_no_crash_on_oom` logs the error and carries on.
        fatal: !message.contains("Suppressing"),
        repeats: 1,
        message: headline_text(message),
        ..Event::default()
    }
}

/// The first line of a message, shortened to something a person reads at a glance.
pub(crate) fn headline_text(flat: &str) -> String {
    let first: String = flat
        .split('\n')
        .next()
        .unwrap_or("")
        .chars()
        .take(400)
        .collect();
    first.trim().to_string()
}

/// A sentence that talks about an OOM (a PR description, an explanation, a changelog), not the
/// error itself: long, written by a person ("we are seeing", "if the config..."), and with no
/// status or exception text.
fn talks_about_an_oom(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    if line.split_whitespace().count() < 12
        || lower.contains("error:")
        || lower.contains("exception:")
        || lower.contains("exhausted:")
        // (PyTorch's host allocator quoted in a sentence, its `RuntimeError: [enforce fail at
        // ...]` taken by the cleaner for a log prefix: `. DefaultCPUAllocator: can't allocate
        // memory）appears when ... How should I modify the code`.)
        || lower.contains("allocator: ")
    {
        return false;
    }
    [
        " we ",
        "we are ",
        "we're ",
        "for example",
        "if the ",
        "if we ",
        "with this change",
        " you can ",
        " should ",
        // A remedy named with the failure it addresses (not `to avoid`: PyTorch's own message
        // says `to avoid fragmentation`).
        " to overcome ",
        " to solve ",
        " to get around ",
        "workaround",
    ]
    .iter()
    .any(|m| {
        lower.contains(m)
            || lower
                .trim_start_matches(['-', '*', ' '])
                .starts_with(m.trim_start())
    })
}

/// One message family (or a group that shares a regex): what it yields, as the JSON spells it,
/// and the function that reads its headline. Order matters: the first row that reads a headline
/// wins, so more specific shapes come before the looser ones that would also match them.
struct FamilyRow {
    /// The `family` (or warning `kind`, or `context`) it yields, in the JSON's spelling.
    yields: &'static str,
    /// The message, as users see it.
    message: &'static str,
    /// Reads the family's headline, when `flat` starts with one.
    read: fn(&Headline<'_>) -> Read,
}

/// What a family's reader says about a headline.
enum Read {
    /// Not this family: try the next row.
    Next,
    /// This family's shape, but not a failure (the kernel's `Killed process` without OOM): stop.
    Stop,
    /// The piece and how many characters of `flat` the headline used.
    Found((Piece, usize)),
}

/// A line and the three after it, as a family's reader sees them.
struct Headline<'a> {
    flat: &'a str,
    first_line_len: usize,
    line: u64,
    pat: &'static Patterns,
}

impl<'a> Headline<'a> {
    fn first_line(&self) -> &'a str {
        &self.flat[..self.first_line_len]
    }

    /// The captures of `re` on `flat`, when the match starts on the first line (otherwise the
    /// next line is the real start).
    fn first(&self, re: &Regex) -> Option<Captures<'a>> {
        re.captures(self.flat)
            .filter(|c| c.get(0).is_some_and(|m| m.start() <= self.first_line_len))
    }
}

fn end_of(c: &Captures<'_>) -> usize {
    c.get(0).map_or(0, |m| m.end())
}

/// Every message family, in the order they are tried (CONTRIBUTING.md: "a new message family").
const FAMILIES: &[FamilyRow] = &[
    FamilyRow {
        yields: "allocator_retry",
        message: "warning: `failed to allocate X (N bytes) from device: CUDA_ERROR_OUT_OF_MEMORY`, `Failed to allocate device memory of X (N bytes): RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY` (the allocator retries smaller)",
        read: cuda_device_warning,
    },
    FamilyRow {
        yields: "gpu_oom_allocate",
        message: "`cuMemAllocAsync failed to allocate N bytes`, with `Free memory/Total memory`",
        read: async_alloc,
    },
    FamilyRow {
        yields: "host_oom",
        message: "`failed to alloc N bytes on host`, `could not allocate pinned host memory`",
        read: host_pinned,
    },
    FamilyRow {
        yields: "tpu_tc_sc",
        message: "`TensorCore Hbm usage: X, SparseCore Hbm usage: Y, exceeding available bytes: Z`",
        read: tc_sc,
    },
    FamilyRow {
        yields: "tpu_compile_vmem",
        message: "`Ran out of memory in memory space vmem while allocating on stack for %x = f32[...]`",
        read: vmem_stack,
    },
    FamilyRow {
        yields: "tpu_compile_hbm",
        message: "`Ran out of memory in memory space hbm. Used X of Y hbm. Exceeded hbm capacity by Z` (also tpu_compile_hbm_old, and tpu_compile_vmem for vmem/smem)",
        read: tpu_hbm,
    },
    FamilyRow {
        yields: "tpu_hlo_temporaries",
        message: "`the total memory required for HLO temporaries (X) exceeds available hbm (Y)`",
        read: hlo_temporaries,
    },
    FamilyRow {
        yields: "tpu_abort_early",
        message: "`Aborting compilation early because it's unlikely to have enough memory. Requires X, has Y available`",
        read: abort_early,
    },
    FamilyRow {
        yields: "tpu_compile_vmem",
        message: "`Scoped allocation with size X and limit Y exceeded scoped vmem limit by Z`",
        read: scoped_vmem,
    },
    FamilyRow {
        yields: "tpu_allocation_exceeds",
        message: "`Allocation (size=N) would exceed memory (size=M) :: #allocation [shape = ...]`",
        read: allocation_exceeds,
    },
    FamilyRow {
        yields: "tpu_program_load",
        message: "`Error loading program: Attempting to reserve X at the bottom of memory`, `Error loading program 'p': Attempting to allocate X. ... There are Y free.`",
        read: program_load,
    },
    FamilyRow {
        yields: "tpu_runtime_alloc",
        message: "`Attempting to allocate X. That was not possible. There are Y free.`",
        read: runtime_alloc,
    },
    FamilyRow {
        yields: "tpu_runtime_alloc",
        message: "the 2022 TPU wording `Could not allocate N bytes in memory hbm; M bytes allocatable, K bytes available`",
        read: could_not_allocate,
    },
    FamilyRow {
        yields: "context",
        message: "PyTorch/XLA's `Post Compilation Analysis` (`Graph input size: X GB`): figures for the next failure",
        read: ptxla_post,
    },
    FamilyRow {
        yields: "context",
        message: "`rematerialization limit X = P% of hbm (Y) - (arguments (A) - aliased_output (B))`",
        read: remat_limit,
    },
    FamilyRow {
        yields: "remat_warning",
        message: "`Can't reduce memory use below X by rematerialization; only reduced to Y`",
        read: remat,
    },
    FamilyRow {
        yields: "bfc_allocator",
        message: "`Allocator (GPU_0_bfc) ran out of memory trying to allocate X` (and the warning bfc_not_a_failure)",
        read: bfc,
    },
    FamilyRow {
        yields: "tf_oom_tensor",
        message: "`OOM when allocating tensor with shape[...] and type float on /job:.../device:GPU:0`",
        read: tf_oom,
    },
    FamilyRow {
        yields: "tf_oom_tensor",
        message: "`Ran out of GPU memory when allocating N bytes for` (TensorFlow 1.x)",
        read: tf_gpu_bytes,
    },
    FamilyRow {
        yields: "gpu_failed_request",
        message: "`Failed to allocate request for X (N B) on device ordinal K`",
        read: failed_request,
    },
    FamilyRow {
        yields: "gpu_oom_allocate",
        message: "`Out of memory while trying to allocate X` (host_oom with `host`)",
        read: gpu_oom,
    },
    FamilyRow {
        yields: "host_oom",
        message: "the kernel's OOM killer: `Out of memory: Killed process N (python)`",
        read: host_killed,
    },
    FamilyRow {
        yields: "host_oom",
        message: "the shell's `Killed` (a process the kernel killed, almost always for memory), `\"killed\"` quoted as the output a user got, or SIGKILL said with out-of-memory",
        read: shell_killed,
    },
    FamilyRow {
        yields: "bfc_allocator",
        message: "the middle of a BFC dump, `Bin for X was Y, Chunk State`: a partial event",
        read: bin_for,
    },
    FamilyRow {
        yields: "allocator_stats",
        message: "`Sum Total of in-use chunks: X`: statistics for the previous failure",
        read: bfc_summary,
    },
    FamilyRow {
        yields: "tpu_compile_hbm",
        message: "`Ran out of memory in memory space S` with no figure (tpu_compile_vmem for vmem/smem)",
        read: space_only,
    },
    FamilyRow {
        yields: "(families.rs)",
        message: "families from outside XLA's runtime: PyTorch CUDA, CUDA driver, CuPy, vLLM, XLA:GPU constants, Gaudi, Tenstorrent",
        read: outside_xla,
    },
    FamilyRow {
        yields: "cuda_oom",
        message: "a failure told in the first person, no message pasted (unrecognized when no GPU word) (`after some epochs I receive a OOM error`, `it always OOM`, `the GPU I'm using runs out of memory`)",
        read: prose_report,
    },
    FamilyRow {
        yields: "unrecognized",
        message: "an OOM status or phrase with no readable figure",
        read: generic,
    },
];

/// The message families the headline parser reads, in the order it tries them: what each yields
/// (the JSON's `family`, warning `kind`, or `context`/`allocator_stats` for figures that join a
/// neighbouring event) and the message it reads. `(families.rs)` stands for the families of
/// [`crate::families`].
pub fn family_table() -> Vec<(&'static str, &'static str)> {
    FAMILIES.iter().map(|r| (r.yields, r.message)).collect()
}

/// The sentence of `text` around `start..end`: from after the last stop before it to the first
/// stop after it (included).
fn sentence_around<'a>(text: &'a str, start: usize, end: usize, stops: &[char]) -> &'a str {
    let from = text[..start].rfind(stops).map_or(0, |i| i + 1);
    let to = text[end..].find(stops).map_or(text.len(), |i| end + i + 1);
    &text[from..to]
}

/// Tries every family on `flat` (a line and the three after it), in [`FAMILIES`]' order. Returns
/// the piece and how many characters of `flat` the headline used.
fn headline(flat: &str, line: u64, pat: &'static Patterns) -> Option<(Piece, usize)> {
    let first_line_len = flat.find('\n').unwrap_or(flat.len());
    let h = Headline {
        flat,
        first_line_len,
        line,
        pat,
    };
    if talks_about_an_oom(&flat[..first_line_len]) {
        // A paragraph may talk in general and still tell the user's own failure in one of its
        // sentences (`For example, when I use TransE, everything goes fine. ... after some
        // epochs I receive a OOM error.`): that sentence alone decides.
        let first = &flat[..first_line_len];
        let lower = first.to_ascii_lowercase();
        // (Or the message quoted in it: `crashed with the message "Your session crashed after
        // using all available RAM.", while PyCaret completed. Is there a way to solve this?`.)
        let at = lower
            .find("oom")
            .or_else(|| lower.find("out of memory"))
            .or_else(|| lower.find("all available ram"))?;
        let sentence = sentence_around(first, at, at, &['.', '!', ';']);
        if talks_about_an_oom(sentence) {
            return None;
        }
        let one = Headline {
            flat: sentence,
            first_line_len: sentence.len(),
            line,
            pat,
        };
        if !lower.contains("oom") && !lower.contains("out of memory") {
            return match shell_killed(&one) {
                Read::Found((piece, _)) => Some((piece, first_line_len)),
                _ => None,
            };
        }
        return match prose_report(&one) {
            Read::Found((piece, _)) => Some((piece, first_line_len)),
            _ => None,
        };
    }
    for row in FAMILIES {
        match (row.read)(&h) {
            Read::Next => {}
            Read::Stop => return None,
            Read::Found(found) => return Some(found),
        }
    }
    None
}

fn cuda_device_warning(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.cuda_device_warning) else {
        return Read::Next;
    };
    let line = h.line;
    // cuda_driver's "failed to allocate X from device": the allocator retries smaller; not fatal.
    let figures = WarningFigures {
        line,
        requested_bytes: c.get(1).or(c.get(2)).and_then(|m| m.as_str().parse().ok()),
        ..WarningFigures::default()
    };
    Read::Found((
        Piece::Warning {
            kind: WarningKind::AllocatorRetry,
            figures,
        },
        end_of(&c),
    ))
}

fn async_alloc(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.async_alloc) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let mut e = new_event(line, Family::GpuOomAllocate, Phase::Runtime, flat);
    e.backend = Some(Backend::Gpu);
    e.memory_space = Some(MemorySpace::Device);
    e.requested_bytes = c[2].parse().ok();
    e.device = c.get(1).map(|m| m.as_str().to_string());
    let mut used = end_of(&c);
    if let Some(f) = pat.cuda_free_total.captures(flat) {
        e.free_bytes = f[1].parse().ok();
        e.limit_bytes = f[2].parse().ok();
        used = used.max(end_of(&f));
    }
    Read::Found((Piece::Event(Box::new(e)), used))
}

fn host_pinned(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.host_pinned) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::HostOom, Phase::Runtime, flat);
    e.memory_space = Some(MemorySpace::Host);
    e.requested_bytes = c.get(1).or(c.get(2)).and_then(|m| m.as_str().parse().ok());
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn tc_sc(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.tc_sc) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TpuTcSc, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = Some(MemorySpace::Hbm);
    e.tensorcore_bytes = size(&c, 1);
    e.sparsecore_bytes = size(&c, 2);
    e.limit_bytes = size(&c, 3);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn vmem_stack(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.vmem_stack) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let mut e = new_event(line, Family::TpuCompileVmem, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = MemorySpace::from_name(&c[1]);
    let shape = c[3].to_string();
    let mut used = end_of(&c);
    let scoped = pat.scoped_vmem.captures(flat);
    if let Some(sc) = &scoped {
        e.requested_bytes = size(sc, 1);
        e.used_bytes = size(sc, 1);
        e.limit_bytes = size(sc, 2);
        e.exceeded_bytes = size(sc, 4);
        used = used.max(end_of(sc));
    }
    e.allocations.extend(e.requested_bytes.map(|size_bytes| {
        Allocation {
            size_bytes,
            shape: None,
            // Only a closed `op_name="..."` (the listing's own regex also reads a cut one).
            op_name: pat
                .op_name
                .captures(flat)
                .filter(|m| m[0].ends_with('"'))
                .map(|m| m[1].to_string()),
            label: Some(format!("{} ({shape})", c[2].trim_start_matches('%'))),
            allocation_type: Some("scoped".into()),
            ..Allocation::default()
        }
    }));
    Read::Found((Piece::Event(Box::new(e)), used))
}

fn tpu_hbm(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.tpu_hbm) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let old = c.get(1).is_some() || flat.contains("Compilation failure");
    let family = if old {
        Family::TpuCompileHbmOld
    } else {
        Family::TpuCompileHbm
    };
    let space = c
        .get(2)
        .or(c.get(5))
        .and_then(|m| MemorySpace::from_name(m.as_str()));
    let family = if matches!(space, Some(MemorySpace::Vmem | MemorySpace::Smem)) {
        Family::TpuCompileVmem
    } else {
        family
    };
    let mut e = new_event(line, family, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = space;
    e.used_bytes = size(&c, 3);
    e.limit_bytes = size(&c, 4);
    e.exceeded_bytes = size(&c, 6);
    if old {
        e.framework = Some(Framework::Tensorflow).filter(|_| !flat.contains("torch"));
    }
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn hlo_temporaries(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.hlo_temporaries) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TpuHloTemporaries, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = MemorySpace::from_name(&c[1]).or(Some(MemorySpace::Hbm));
    e.used_bytes = size(&c, 2);
    e.limit_bytes = size(&c, 3);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn abort_early(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.abort_early) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TpuAbortEarly, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = Some(MemorySpace::Hbm);
    e.used_bytes = size(&c, 1);
    e.limit_bytes = size(&c, 2);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn scoped_vmem(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.scoped_vmem) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TpuCompileVmem, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = MemorySpace::from_name(&c[3]).or(Some(MemorySpace::Vmem));
    e.requested_bytes = size(&c, 1);
    e.used_bytes = size(&c, 1);
    e.limit_bytes = size(&c, 2);
    e.exceeded_bytes = size(&c, 4);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn allocation_exceeds(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.allocation_exceeds) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let space = c.get(5).and_then(|m| MemorySpace::from_name(m.as_str()));
    let scoped =
        flat.contains("scoped") || matches!(space, Some(MemorySpace::Vmem | MemorySpace::Smem));
    let phase = if scoped || flat.contains("compile") {
        Phase::Compile
    } else {
        Phase::Runtime
    };
    let mut e = new_event(line, Family::TpuAllocationExceeds, phase, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = space.or(Some(MemorySpace::Hbm));
    e.requested_bytes = c[1].parse().ok();
    e.limit_bytes = c[2].parse().ok();
    if let Some(shape) = c.get(4) {
        let window = pat.window.captures(flat);
        let shape = window
            .as_ref()
            .map_or(shape.as_str(), |w| w.get(1).map_or("", |m| m.as_str()))
            .to_string();
        let bytes = hbm_doctor_shape_bytes(&shape);
        e.allocations.push(Allocation {
            size_bytes: e.requested_bytes.unwrap_or(0),
            unpadded_bytes: bytes.map(|b| b.1).filter(|_| window.is_none()),
            shape: Some(shape),
            label: window
                .as_ref()
                .map(|w| format!("block window of {}", &w[2]))
                .or_else(|| {
                    c.get(6)
                        .or(c.get(3))
                        .map(|m| m.as_str().chars().take(200).collect())
                }),
            allocation_type: Some(if scoped {
                "scoped".into()
            } else {
                "buffer".into()
            }),
            ..Allocation::default()
        });
    }
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn program_load(h: &Headline<'_>) -> Read {
    let flat = h.flat;
    let line = h.line;
    if let Some(c) = h.first(&h.pat.program_load_alloc) {
        let mut e = new_event(line, Family::TpuProgramLoad, Phase::Runtime, flat);
        e.backend = Some(Backend::Tpu);
        e.memory_space = Some(MemorySpace::Hbm);
        e.program = c.get(1).map(|m| m.as_str().to_string());
        e.requested_bytes = size(&c, 2);
        e.free_bytes = size(&c, 3);
        return Read::Found((Piece::Event(Box::new(e)), end_of(&c)));
    }
    let Some(c) = h.first(&h.pat.program_load) else {
        return Read::Next;
    };
    let mut e = new_event(line, Family::TpuProgramLoad, Phase::Runtime, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = Some(MemorySpace::Hbm);
    e.program = c.get(1).map(|m| m.as_str().to_string());
    e.requested_bytes = size(&c, 2);
    e.free_bytes = size(&c, 3);
    e.reserved_bytes = size(&c, 4);
    e.largest_free_bytes = size(&c, 5);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn runtime_alloc(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.runtime_alloc) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let mut e = new_event(line, Family::TpuRuntimeAlloc, Phase::Runtime, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = Some(MemorySpace::Hbm);
    e.requested_bytes = size(&c, 1);
    e.free_bytes = size(&c, 2);
    e.device = c.get(3).map(|m| m.as_str().to_string());
    if let Some(l) = pat.largest_free.captures(flat) {
        e.largest_free_bytes = size(&l, 1);
    }
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn could_not_allocate(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.could_not_allocate) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TpuRuntimeAlloc, Phase::Runtime, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = Some(MemorySpace::Hbm);
    e.requested_bytes = c[1].parse().ok();
    e.device = Some(c[2].to_string());
    // What one allocation can get (the largest contiguous block) and what is free in all.
    e.largest_free_bytes = c[3].parse().ok();
    e.free_bytes = c[4].parse().ok();
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn ptxla_post(h: &Headline<'_>) -> Read {
    if !h.first_line().contains("Graph input size") {
        return Read::Next;
    }
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let first_line_len = h.first_line_len;
    // PyTorch/XLA's PT_XLA_DEBUG "Post Compilation Analysis" block, printed before a run.
    let (mut arguments, mut outputs, mut aliased, mut temps, mut used) =
        (None, None, None, None, 0);
    for c in pat.ptxla_post.captures_iter(flat) {
        let gb = c[2]
            .parse::<f64>()
            .ok()
            .map(|v| (v * 1024f64.powi(3)).round() as u64);
        match &c[1] {
            "Graph input size" => arguments = gb,
            "Graph output size" => outputs = gb,
            "Aliased Input size" => aliased = gb,
            "Intermediate tensor size" => temps = gb,
            _ => {}
        }
        used = c.get(0).map_or(used, |m| m.end());
    }
    if arguments.is_some() {
        return Read::Found((
            Piece::Context {
                line,
                arguments,
                aliased,
                outputs,
                temps,
            },
            used.max(first_line_len),
        ));
    }
    Read::Next
}

fn remat_limit(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.remat_limit) else {
        return Read::Next;
    };
    let line = h.line;
    Read::Found((
        Piece::Context {
            line,
            arguments: size(&c, 3),
            aliased: size(&c, 4),
            outputs: None,
            temps: None,
        },
        end_of(&c),
    ))
}

fn remat(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.remat) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let exact = |i: usize, j: usize| {
        c.get(i)
            .and_then(|m| m.as_str().parse().ok())
            .or_else(|| size(&c, j))
    };
    let remat = Remat {
        target_bytes: exact(2, 1).unwrap_or(0),
        reduced_to_bytes: exact(4, 3).unwrap_or(0),
        original_bytes: exact(6, 5),
    };
    Read::Found((
        Piece::Remat {
            line,
            remat,
            message: headline_text(flat),
        },
        end_of(&c),
    ))
}

fn bfc(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.bfc) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    if flat.contains("not a failure") || flat.contains("caller indicates") {
        let figures = WarningFigures {
            line,
            requested_bytes: c
                .get(3)
                .and_then(|m| m.as_str().parse().ok())
                .or_else(|| size(&c, 2)),
            ..WarningFigures::default()
        };
        return Read::Found((
            Piece::Warning {
                kind: WarningKind::BfcNotAFailure,
                figures,
            },
            end_of(&c),
        ));
    }
    // Old TensorFlow (`gpu_bfc_allocator.cc`) names no allocator: the file says it is a GPU's.
    let allocator = c
        .get(1)
        .map_or_else(|| "gpu_bfc".to_string(), |m| m.as_str().to_string());
    let host = allocator.to_ascii_lowercase().contains("cpu")
        || allocator.to_ascii_lowercase().contains("host");
    let mut e = new_event(line, Family::BfcAllocator, Phase::Runtime, flat);
    e.backend = if host { None } else { Some(Backend::Gpu) };
    e.memory_space = Some(if host {
        MemorySpace::Host
    } else {
        MemorySpace::Device
    });
    e.requested_bytes = c
        .get(3)
        .and_then(|m| m.as_str().parse().ok())
        .or_else(|| size(&c, 2));
    e.device = Some(allocator);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn tf_gpu_bytes(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.tf_gpu_bytes) else {
        return Read::Next;
    };
    let mut e = new_event(h.line, Family::TfOomTensor, Phase::Runtime, h.flat);
    e.framework = Some(Framework::Tensorflow);
    e.backend = Some(Backend::Gpu);
    e.memory_space = Some(MemorySpace::Device);
    e.requested_bytes = c[1].parse().ok();
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn tf_oom(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.tf_oom) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::TfOomTensor, Phase::Runtime, flat);
    e.framework = Some(Framework::Tensorflow);
    let dims: Vec<u64> = c[1]
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    // Old messages name neither the type nor the device: only what is stated is kept.
    let dtype = c.get(2).map(|m| m.as_str().to_string());
    let device = c
        .get(3)
        .map(|m| m.as_str().trim_end_matches([',', '.']).to_string());
    // Old messages without a device still name the op's placement on the node line under it
    // (`[[Node: ... _device="/job:localhost/replica:0/task:0/device:CPU:0"]]`).
    let placed = || {
        let rest = &flat[end_of(&c).min(flat.len())..];
        let at = rest.find("_device=\"")?;
        let d = &rest[at + 9..];
        Some(d[..d.find('"').unwrap_or(d.len())].to_string())
    };
    let lower = device
        .clone()
        .or_else(placed)
        .unwrap_or_default()
        .to_ascii_lowercase();
    e.backend = if lower.contains("gpu") {
        Some(Backend::Gpu)
    } else if lower.contains("tpu") {
        Some(Backend::Tpu)
    } else if lower.contains("cpu") {
        Some(Backend::Cpu)
    } else {
        None
    };
    e.memory_space = match e.backend {
        Some(Backend::Gpu) => Some(MemorySpace::Device),
        Some(Backend::Tpu) => Some(MemorySpace::Hbm),
        Some(Backend::Cpu) => Some(MemorySpace::Host),
        None => None,
    };
    if let Some(dtype) = dtype {
        let bits = hbm_doctor_hlo::PrimitiveType::parse(&dtype).map_or(32, |t| t.bits());
        let elements = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
        let bytes = elements.saturating_mul(u64::from(bits)).div_ceil(8);
        e.requested_bytes = Some(bytes);
        let shape = format!(
            "{dtype}[{}]",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
        e.allocations.push(Allocation {
            size_bytes: bytes,
            shape: Some(shape),
            allocation_type: Some("tensor".into()),
            ..Allocation::default()
        });
    } else if !dims.is_empty() {
        // TensorFlow before 1.5 prints the shape alone (`OOM when allocating tensor with
        // shape[1664,279617]`): the tensor is listed with its shape as printed and its size at
        // 4 bytes per element (TensorFlow's default float32); the request stays unstated.
        let elements = dims.iter().fold(1u64, |a, &d| a.saturating_mul(d));
        e.allocations.push(Allocation {
            size_bytes: elements.saturating_mul(4),
            shape: Some(format!(
                "[{}]",
                dims.iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            allocation_type: Some("tensor".into()),
            ..Allocation::default()
        });
    }
    e.device = device;
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn failed_request(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.failed_request) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let mut e = new_event(line, Family::GpuFailedRequest, Phase::Runtime, flat);
    e.requested_bytes = c
        .get(2)
        .and_then(|m| m.as_str().parse().ok())
        .or_else(|| size(&c, 1));
    e.device = c.get(3).map(|d| format!("device ordinal {}", d.as_str()));
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn gpu_oom(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.gpu_oom) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let host = c.get(1).is_some();
    let mut e = new_event(
        line,
        if host {
            Family::HostOom
        } else {
            Family::GpuOomAllocate
        },
        Phase::Runtime,
        flat,
    );
    e.requested_bytes =
        size(&c, 2).or_else(|| c.get(3).or(c.get(4)).and_then(|m| m.as_str().parse().ok()));
    if host {
        e.memory_space = Some(MemorySpace::Host);
    }
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn host_killed(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.host_killed) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    if !(flat.contains("Out of memory") || flat.contains("oom") || flat.contains("OOM")) {
        return Read::Stop;
    }
    let mut e = new_event(line, Family::HostOom, Phase::Runtime, flat);
    e.memory_space = Some(MemorySpace::Host);
    e.device = c
        .get(2)
        .filter(|m| !m.as_str().is_empty())
        .map(|m| format!("process {}", m.as_str()));
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn shell_killed(h: &Headline<'_>) -> Read {
    let first = h.first_line();
    let Some(m) = h.pat.shell_killed.find(first) else {
        return Read::Next;
    };
    let mut e = new_event(h.line, Family::HostOom, Phase::Runtime, h.flat);
    e.memory_space = Some(MemorySpace::Host);
    Read::Found((Piece::Event(Box::new(e)), m.end()))
}

fn bin_for(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.bin_for) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    // The middle of a BFC dump: the bin the failed request fell in names its size.
    let mut e = new_event(line, Family::BfcAllocator, Phase::Runtime, flat);
    e.partial = true;
    e.requested_bytes = size(&c, 1);
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn bfc_summary(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.bfc_summary) else {
        return Read::Next;
    };
    let line = h.line;
    // The stats follow within a few lines; read them from `flat` and the region later.
    let stats = Piece::AllocatorStats {
        line,
        limit: None,
        in_use: size(&c, 1),
        largest_free: None,
    };
    Read::Found((stats, end_of(&c)))
}

fn space_only(h: &Headline<'_>) -> Read {
    let Some(c) = h.first(&h.pat.space_only) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let space = MemorySpace::from_name(&c[1]);
    let family = if matches!(space, Some(MemorySpace::Vmem | MemorySpace::Smem)) {
        Family::TpuCompileVmem
    } else {
        Family::TpuCompileHbm
    };
    let mut e = new_event(line, family, Phase::Compile, flat);
    e.backend = Some(Backend::Tpu);
    e.memory_space = space;
    Read::Found((Piece::Event(Box::new(e)), end_of(&c)))
}

fn outside_xla(h: &Headline<'_>) -> Read {
    crate::families::headline(h.flat, h.first_line_len, h.line).map_or(Read::Next, Read::Found)
}

/// A failure the user tells in words without pasting the message: `after some epochs I receive a
/// OOM error`, `but it always OOM`, `the GPU I'm using (A40, 48 GB VRAM) runs out of memory from
/// training`. Talk about OOMs is in the third person, the plural, the conditional or a remedy
/// (`fixes the OOM`, `to avoid OOM errors`, `could run out of memory`); a report is someone's own
/// run failing. No figure is read: the event says an OOM happened, the text around it says the
/// rest.
fn prose_report(h: &Headline<'_>) -> Read {
    static RES: OnceLock<[Regex; 3]> = OnceLock::new();
    let first = h.first_line();
    let lower = first.to_ascii_lowercase();
    if !(lower.contains("oom")
        || lower.contains("out of memory")
        || lower.contains("out-of-memory"))
    {
        return Read::Next;
    }
    // A printed message is read by the readers of messages (PyTorch's `CUDA out of memory` too).
    if lower.contains("cuda out of memory")
        || first.contains("Error:")
        || first.contains("RESOURCE_EXHAUSTED")
        || first.contains("Exception:")
    {
        return Read::Next;
    }
    let [got, ooms, device] = built_in(
        &RES,
        [
            // `I receive a OOM error`, `I always get CUDA out of memory`, `we hit an OOM`, `it
            // meets cuda oom error`, `I met ran out of memory problem`.
            r"(?i)\b(?:i|we|it|my\s+[\w-]+)\s+(?:always\s+|still\s+|then\s+|now\s+|keep\s+|constantly\s+|eventually\s+|immediately\s+|also\s+|will\s+|would\s+)?(?:receive[sd]?|get|gets|got|getting|encounter(?:ed|s)?|ran into|run into|runs into|am running into|are running into|keep running into|hit|hits|faced?|met|meet|meets|am getting|are getting|keep getting|am having|have|had|throws|threw)\s+(?:a|an|the|this|that|same|into)?\s*(?:cuda\s+|gpu\s+|hbm\s+|tpu\s+)?(?:oom|out[- ]of[- ]memory|ran out of memory|run out of memory)\b",
            // `but it always OOM`, `training OOMs after 3 epochs`.
            // `tensor parallel hits OOM`, `It is host OOM` (the user's diagnosis of their run).
            r"(?i)\b(?:it|training|the training|my training|the model|my model|the job|my job|the script)\s+(?:always\s+|still\s+|then\s+|eventually\s+|immediately\s+)?(?:ooms?|goes oom|went oom)\b|\b(?:hits|hitting)\s+(?:an?\s+)?(?:host\s+|cuda\s+|gpu\s+|hbm\s+|tpu\s+)?oom\b|^\s*it(?:'s|\s+is|\s+was)\s+(?:an?\s+)?(?:host\s+|cuda\s+|gpu\s+|hbm\s+|tpu\s+)?oom\b|\b(?:i|we)\b[^.]{0,80}?\bdue\s+to\s+(?:an?\s+)?(?:cuda\s+|gpu\s+)?(?:oom|out[- ]of[- ]memory)\b|\b(?:is|was)\s+causing\s+(?:an?\s+)?(?:cuda\s+|gpu\s+|hbm\s+|tpu\s+)?(?:oom|out[- ]of[- ]memory)\b|\b(?:grows?|grew|growing|increas\w*|rises|rising)\b[^.]{0,40}\buntil\s+(?:an?\s+)?(?:cuda\s+|gpu\s+|hbm\s+|tpu\s+)?(?:oom|out[- ]of[- ]memory)\b",
            // `the GPU I'm using (A40, 48 GB VRAM) runs out of memory from training`.
            r"(?i)\bthe (?:gpu|card|device)\b[^.]{0,60}?\b(?:runs|ran) out of memory\b",
        ],
    );
    // The sentence introduces the pasted log (`I get the OOM error. Here is how the log looks
    // like.`, `... the OOM issue:`): the printed failure below is the event.
    let word = |k: &str| {
        lower.match_indices(k).any(|(i, _)| {
            !lower[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphabetic())
        })
    };
    let introduces = lower.trim_end().ends_with(':')
        || ["here is", "here's", "below", "the log", "traceback"]
            .iter()
            .any(|k| word(k));
    if introduces {
        return Read::Next;
    }
    let found = got
        .find(first)
        .or_else(|| ooms.find(first))
        .or_else(|| device.find(first))
        .map(|m| (m.start(), m.end()));
    // The sentence that tells it decides (a paragraph's other sentences may address the reader
    // or ask): a remedy, a conditional, a question or advice to the reader is talk.
    let talk = |sentence: &str| {
        let l = sentence.to_ascii_lowercase();
        [
            "avoid",
            "prevent",
            "fix",
            "reduce",
            "could ",
            "would ",
            "might ",
            "may ",
            " if ",
            "you can",
            "you should",
            "you need",
            "you will",
            "you'll",
            "you get",
            "you have to",
            "when you ",
            // A diagnosis of a failure told before (`I investigated this issue and found that
            // the OOM occurs because ...`): an explanation, not a report.
            "investigat",
            "root cause",
            "overcome",
            "need to go",
            // A remedy said in Chinese: prevent, avoid, solve, fix.
            "防止",
            "避免",
            "解决",
            "修复",
        ]
        .iter()
        .any(|k| l.contains(k))
            || (l.contains('?') || l.contains('？'))
                && !l.contains(" i ")
                && !l.starts_with("my ")
                && !l.contains(" my ")
    };
    // Failures in the plural after the phrase (`it throws OOM errors because ...`), or a line
    // that goes on to say the error was fixed (a pull request's description), are talk too.
    let plural = |b: usize| {
        let rest = lower[b..].trim_start();
        ["errors", "issues", "problems", "exceptions"]
            .iter()
            .any(|w| rest.starts_with(w))
    };
    let fixed = [
        "been fixed",
        "is fixed",
        "was fixed",
        "this pr ",
        "this pull request",
    ]
    .iter()
    .any(|k| lower.contains(k));
    let found = found.filter(|&(a, b)| {
        let generic = ["it ", "is ", "was "]
            .iter()
            .any(|k| lower[a..].starts_with(k));
        let talked = talk(sentence_around(first, a, b, &['.', '!', '?']));
        !(fixed || talked || generic && plural(b))
    });
    let found = found.map(|(_, b)| b);
    // An issue's title naming the failure (`OOM during training on v3-8`, `XLM-R model OOM
    // (PyTorch XLA limitations vs TF)`): the first line of a post, short, the word itself; a pull
    // request's title says what it changes (`Fix OOM in eval`, `Add an OOM test`).
    let title = h.line == 1
        && first.split_whitespace().count() <= 12
        && first.chars().count() <= 100
        && !first.contains(':')
        && !h.pat.not_memory.is_match(first)
        && !talk(first)
        && {
            let change = [
                "add", "support", "handl", "detect", "test", "doc", "bench", "improv", "enable",
                "allow", "option", "flag", "refactor", "bump", "update", "catch", "retry",
                "recover", "warn", "log", "load", "void", "avoid", "prevent", "fix", "reduc",
                "save", "offload", "free", "releas", "clear", "move", "use",
            ];
            let words: Vec<&str> = lower
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            let at = words
                .iter()
                .position(|w| *w == "oom")
                .or_else(|| words.windows(3).position(|w| w == ["out", "of", "memory"]));
            // A pull request's title starts with what it changes (`Fix OOM in eval`, `Reduce
            // memory ...`); words after the failure describe when it came (`CUDA OOM when
            // accelerator.load_state() with multi-GPU training`).
            at.is_some_and(|at| {
                !words[..at]
                    .iter()
                    .any(|w| change.iter().any(|c| w.starts_with(c)))
            })
        };
    let Some(end) = found.or_else(|| title.then_some(first.len())) else {
        return Read::Next;
    };
    // The memory the line names (the same words as a failure told in prose).
    let (family, backend, space) = told_memory(first);
    let mut e = new_event(h.line, family, Phase::Runtime, h.flat);
    e.told = true;
    e.backend = backend;
    e.memory_space = space;
    Read::Found((Piece::Event(Box::new(e)), end))
}

fn generic(h: &Headline<'_>) -> Read {
    let first = h.first_line();
    let Some(m) = h.pat.generic.find(first) else {
        return Read::Next;
    };
    let flat = h.flat;
    let line = h.line;
    let pat = h.pat;
    let first_line_len = h.first_line_len;
    if pat.not_memory.is_match(first) {
        return Read::Stop;
    }
    // A bare name (`I got ResourceExhaustedError`) says nothing itself: the error printed under
    // it decides (`ResourceExhaustedError: ...; Too many open files` is not memory).
    // The phrase quoted alone in a sentence (`should observe an 'out of memory' (OOM) error`)
    // names the message; a pasted message carries its text on (`"Out of memory while ..."`).
    // (Also with a word or three inside the quotes, in a sentence about a remedy: `This
    // modified code may be able to mitigate 'CUDA Out of memory error' in case of ...`; a
    // user's `I got this error"RuntimeError: CUDA out of memory"` is a report.)
    let quotes = ['\'', '"', '`'];
    let (before, after) = (&first[..m.start()], &first[m.end()..]);
    let alone = before.ends_with(quotes) && after.starts_with(quotes);
    let quoted = match (before.rfind(quotes), after.find(quotes)) {
        (Some(a), Some(b)) => {
            before[a..].chars().next() == after[b..].chars().next()
                && before[a + 1..].split_whitespace().count()
                    + after[..b].split_whitespace().count()
                    <= 3
        }
        _ => false,
    };
    let remedy = || {
        // (The sentence around the phrase, not the whole paragraph.)
        let start = before.rfind(". ").map_or(0, |i| i + 2);
        let end = after.find(". ").map_or(first.len(), |i| m.end() + i);
        let l = first[start..end].to_ascii_lowercase();
        [
            " may ",
            " might ",
            " could ",
            "mitigat",
            " avoid ",
            " in case ",
        ]
        .iter()
        .any(|k| l.contains(k))
    };
    if (alone || quoted && remedy()) && first.split_whitespace().count() >= 8 {
        return Read::Stop;
    }
    // The status word used as a noun inside a long sentence (`instead of the clean
    // RESOURCE_EXHAUSTED the narrative implies`): a status is followed by its message.
    // The same for libtpu's error code (`E1001: CompileTimeScopedVmemOom: Ran out of ...`):
    // named in a sentence (`fails compilation with E1001: CompileTimeScopedVmemOom on every
    // run`), it is talk about the error.
    let code_end = m.end()
        + first[m.end()..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(first.len() - m.end());
    if matches!(m.as_str(), "RESOURCE_EXHAUSTED" | "ScopedVmemOom")
        && !first[code_end..].trim_start().starts_with(':')
        && first.split_whitespace().count() >= 12
        && !first[..m.start()].contains("Status")
    {
        return Read::Stop;
    }
    // An API's response status (`"status": "RESOURCE_EXHAUSTED"` in a JSON error: a quota, a
    // rate limit) or a status whose message is a file path (`RESOURCE_EXHAUSTED:
    // /data/part-3.parquet; Too many open files`): a resource, not memory. A memory status
    // carries its message (`RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...`).
    if m.as_str() == "RESOURCE_EXHAUSTED" {
        let before = first[..m.start()].trim_end();
        let api = before.ends_with('"')
            && before[..before.len() - 1].trim_end().ends_with(':')
            && before.to_ascii_lowercase().contains("status");
        let rest = first[code_end..].trim_start();
        let path = rest.strip_prefix(':').is_some_and(|r| {
            let r = r.trim_start();
            r.starts_with('/') || r.get(1..3) == Some(":\\")
        });
        if api || path {
            return Read::Stop;
        }
    }
    let bare = first[m.end()..]
        .trim_start_matches(|c: char| c.is_ascii_alphanumeric())
        .trim()
        .trim_end_matches(['.', '!', ':'])
        .is_empty();
    if bare && pat.not_memory.is_match(flat) {
        return Read::Stop;
    }
    // "out of memory" in prose (a log that *talks* about OOMs) is not an event unless it is
    // the status text itself.
    // The status word used as a noun in a sentence ("can produce a RESOURCE_EXHAUSTED
    // message") is prose, not a status.
    // (`The Resource exhausted error happen after at least 46831 trainning steps`: the same,
    // in words.)
    let prose = [
        "a RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED message",
        "RESOURCE_EXHAUSTED error",
        "Resource exhausted error",
        "resource exhausted error",
    ]
    .iter()
    .any(|p| first.contains(p))
        && first.split_whitespace().count() > 12;
    if prose {
        return Read::Stop;
    }
    // A sentence about a remedy (`Set eval accumulation steps to avoid OOM when evaluating`,
    // `This PR fixes the GPU out of memory issue when loading checkpoints.`): the fix is told,
    // the failure is not printed. A printed message carries a colon (`Error: ...`, a log prefix).
    let before = first[..m.start()].to_ascii_lowercase();
    let remedy = [
        "avoid", "prevent", "fixes ", "fix ", "fixed ", "fixing ", "reduce ", "reduces ",
    ]
    .iter()
    .any(|k| before.contains(k))
        // A consequence foretold (`that will lead to an out of memory error`, `can cause OOM`):
        // a possibility, not a failure that happened.
        || (["will ", "would ", "can ", "could ", "may ", "might "]
            .iter()
            .any(|k| before.contains(k))
            && ["lead", "cause", "result"].iter().any(|k| before.contains(k)));
    if remedy && !first.contains(':') {
        return Read::Stop;
    }
    // A commit's or pull request's title (`fix batch_size in transformer_main.py which causes
    // ResourceExhaustedError: OOM during training`): it starts with the fix and names the
    // failure as what the fixed thing caused; a printed message never starts with `fix`.
    let opening = before.trim_start_matches(['-', '*', '#', ' ', '[', ']']);
    let fix_title = ["fix ", "fixes ", "fixed ", "fixing ", "avoid ", "prevent "]
        .iter()
        .any(|k| opening.starts_with(k))
        && ["caus", "lead", "result", "trigger"]
            .iter()
            .any(|k| before.contains(k));
    if fix_title {
        return Read::Stop;
    }
    // A failure and its fix told together (`... results in an out of memory error. Changing
    // batch size from 8 to 4 fixes it.`): a fix summary (a PR description), not a failure.
    let after = first[m.end()..].to_ascii_lowercase();
    let fixed = [
        "fixes it",
        "fixed it",
        "solves it",
        "solved it",
        "resolves it",
        "resolved it",
    ]
    .iter()
    .any(|k| after.contains(k));
    // (A link's `https://` is no message's colon.)
    let colon = first
        .match_indices(':')
        .any(|(i, _)| !first[i..].starts_with("://"));
    if fixed && !colon {
        return Read::Stop;
    }
    let status = first.contains("RESOURCE_EXHAUSTED")
        || first.contains("Resource exhausted")
        || first.contains("ResourceExhausted")
        // TensorFlow's status is `OOM when allocating`; `causing OOM when total allocated ...`
        // is a sentence.
        || first.contains("OOM when alloc")
        // TensorFlow's op-kernel warning: `OP_REQUIRES failed at conv_ops.cc:942 : Resource
        // exhausted`.
        || first.to_ascii_lowercase().contains("op_requires failed at")
        || first.contains("ScopedVmemOom")
        // An exception printed with its text, quoted inside a sentence (`I always get`
        // OutOfMemoryError: CUDA out of memory` at the first training step`).
        || first.contains("OutOfMemoryError: ");
    let oom_phrase = first.contains("Ran out of memory")
        || first.contains("Out of memory")
        || first.contains("out of memory");
    if !status && !oom_phrase {
        return Read::Stop;
    }
    if !status && first.split_whitespace().count() > 40 {
        return Read::Stop;
    }
    // A sentence that tells of running out of memory ("causing the TPUs to run out of
    // memory."), not a message: lower-case verb, no `Error:`-style colon on the line.
    let told = [
        "run out of memory",
        "runs out of memory",
        "running out of memory",
        " ran out of memory",
    ]
    .iter()
    .any(|v| {
        first.to_ascii_lowercase().contains(v) && !first.contains(&capitalize_first(v.trim_start()))
    });
    if !status && told && !first.contains(':') {
        return Read::Stop;
    }
    // Failures counted in the plural (`The CI tests frequently fail with CUDA out of memory
    // errors.`): a summary of many failures, not one printed; a message never pluralizes itself.
    let lower = first.to_ascii_lowercase();
    let plural = [
        "out of memory errors",
        "out of memory issues",
        "out of memory problems",
    ]
    .iter()
    .any(|p| lower.contains(p));
    if !status && plural && !first.contains(':') {
        return Read::Stop;
    }
    let _ = m;
    let mut e = new_event(line, Family::Unrecognized, Phase::Runtime, flat);
    // The words of a family's message without its figures: PyTorch's `CUDA out of memory`
    // (the CUDA runtime's own text is `CUDA error: out of memory`), TensorFlow's exception
    // class as a notebook heads its traceback (`ResourceExhaustedError    Traceback (most
    // recent call last)`), the traceback cut before its `OOM when allocating` line.
    let lower_first = first.to_ascii_lowercase();
    if [
        "cuda out of memory",
        "hip out of memory",
        "xpu out of memory",
    ]
    .iter()
    .any(|k| lower_first.contains(k))
    {
        e.family = Family::PytorchCudaOom;
        e.framework = Some(Framework::Pytorch);
        e.backend = Some(Backend::Gpu);
        e.memory_space = Some(MemorySpace::Device);
        // The headline alone, cut before the device's figures: its request is still stated.
        if let Some(c) = pat.tried_to_allocate.captures(first) {
            e.requested_bytes = c.get(1).and_then(|m| parse_size(m.as_str()));
        }
    } else if pat.notebook_exception.is_match(first)
        || first.to_ascii_lowercase().contains("op_requires failed at")
        // An op kernel's own status (`W tensorflow/core/framework/op_kernel.cc:1733]
        // RESOURCE_EXHAUSTED: failed to allocate memory`, its log prefix usually cleaned
        // away): TensorFlow's, its tensor unnamed.
        || first.contains("framework/op_kernel.cc")
        || first.contains("RESOURCE_EXHAUSTED: failed to allocate memory")
        || first.contains("Resource exhausted: failed to allocate memory")
    {
        // TensorFlow's op-kernel line (`OP_REQUIRES failed at conv_grad_input_ops.cc:942 :
        // Resource exhausted: OOM when allocating tensor ...`), here without its tensor.
        e.family = Family::TfOomTensor;
        e.framework = Some(Framework::Tensorflow);
    }
    if first.contains("compil") {
        e.phase = Phase::Compile;
    }
    if first.contains("vmem") || first.contains("ScopedVmemOom") {
        e.memory_space = Some(MemorySpace::Vmem);
        e.phase = Phase::Compile;
        e.backend = Some(Backend::Tpu);
    }
    Read::Found((Piece::Event(Box::new(e)), first_line_len))
}

/// `Ran out of memory` from `ran out of memory`: the spelling a message starts with.
fn capitalize_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// A report pasted without its error line: a TPU listing or requirement block, GPU peak buffers,
/// or an allocator dump. It is an event of its own (marked `partial`) unless an error line nearby
/// absorbs it.
fn report_start(text: &str, line: u64, pat: &Patterns) -> Option<Piece> {
    let c = pat.report_start.captures(text)?;
    if c.get(7).is_some() {
        return Some(Piece::AllocatorStats {
            line,
            limit: None,
            in_use: None,
            largest_free: None,
        });
    }
    let space = c
        .get(2)
        .or(c.get(4))
        .or(c.get(5))
        .and_then(|m| MemorySpace::from_name(m.as_str()));
    let gpu = c.get(3).is_some();
    let family = if gpu {
        Family::GpuOomAllocate
    } else if matches!(space, Some(MemorySpace::Vmem | MemorySpace::Smem)) {
        Family::TpuCompileVmem
    } else {
        Family::TpuCompileHbm
    };
    let mut e = new_event(
        line,
        family,
        if gpu { Phase::Runtime } else { Phase::Compile },
        text,
    );
    e.partial = true;
    e.memory_space = space;
    if !gpu {
        e.backend = Some(Backend::Tpu);
    }
    Some(Piece::Event(Box::new(e)))
}

/// Padded and unpadded bytes of a printed shape (padded falls back to unpadded without tiles).
fn hbm_doctor_shape_bytes(text: &str) -> Option<(u64, u64)> {
    let shape = hbm_doctor_hlo::Shape::parse(text)?;
    Some((shape.padded_bytes(), shape.unpadded_bytes()))
}

/// Reads the report lines that follow a headline into the event.
fn read_report(e: &mut Event, head: &[Line], region: &[Line], pat: &Patterns) {
    let mut in_largest = e.partial && e.family != Family::BfcAllocator;
    let mut saw_scoped = false;
    let mut usage_space: Option<String> = None;
    let mut usage_rows: Vec<Allocation> = Vec::new();
    let mut usage_tables = 0usize;
    let mut current: Option<Allocation> = None;
    let mut in_program = false;
    let all = head.iter().chain(region.iter());
    let mut ptxla = false;
    // PyTorch's cudaMallocAsync message: its figures one per line under the headline.
    let async_torch = e.family == Family::PytorchCudaOom
        && head
            .first()
            .is_some_and(|l| l.text.contains("Allocation on device"));
    let mut pending_limit = false;
    let neuron_sb = e.family == Family::OtherAccelerator
        && head
            .first()
            .is_some_and(|l| l.text.contains("couldn't be allocated in SB"));
    for (k, line) in all.enumerate() {
        let t = line.text.trim();
        if t.is_empty() {
            continue;
        }
        if async_torch && k < 12 {
            crate::families::read_async_figures(e, t, &mut pending_limit);
        }
        if neuron_sb && k < 16 {
            crate::families::read_neuron_sb(e, t);
        }
        saw_scoped |= t == "Allocation type: scoped";
        // TensorFlow (and XRT) print this hint under an out-of-memory status only: a listing's
        // tail followed by it is a failure's report, whatever was cut above it.
        if e.partial && t.contains("report_tensor_allocations_upon_oom") {
            e.listing_header = true;
        }
        if let Some(c) = pat.usage_space.captures(t) {
            usage_space = Some(c[1].to_string());
            usage_tables = 0;
            in_largest = false;
            continue;
        }
        if usage_space.as_deref() == Some("default") {
            if t.starts_with("cumulative_size;") {
                usage_tables += 1;
                continue;
            }
            if let Some(c) = pat.usage_total.captures(t) {
                let exact = c[1].parse().ok();
                if crate::merge::agree(e.used_bytes, exact) != Some(false) {
                    e.used_bytes = exact;
                }
                continue;
            }
            if let Some(c) = pat.usage_row.captures(t) {
                let shapes = c[5].trim();
                if !shapes.starts_with('(') {
                    let first = shapes.split(", ").next().unwrap_or(shapes);
                    let first = first.split('×').next_back().unwrap_or(first).to_string();
                    // A slot holds each of its values in turn: its logical size is the largest's,
                    // and that value is what the slot is sized for (`bf16[2048,16384], ...,
                    // 2×bf16[64,16384,4096]` in an 8 GiB slot is the stacked parameters, not the
                    // 64 MiB activation listed first).
                    let largest = shapes
                        .split(", ")
                        .filter_map(|v| {
                            let v = v.split('×').next_back().unwrap_or(v);
                            hbm_doctor_hlo::Shape::parse(v).map(|sh| (sh.unpadded_bytes(), v))
                        })
                        .fold(None, |best: Option<(u64, &str)>, (b, v)| match best {
                            Some((bb, _)) if bb >= b => best,
                            _ => Some((b, v)),
                        });
                    let unpadded = largest.map(|(b, _)| b);
                    if usage_tables >= 2 {
                        if let (Some(b), Some((_, v))) = (size(&c, 2), largest) {
                            e.held.push((b, v.to_string()));
                        }
                    }
                    usage_rows.push(Allocation {
                        size_bytes: size(&c, 2).unwrap_or(0),
                        unpadded_bytes: unpadded,
                        shape: Some(largest.map_or(first, |(_, v)| v.to_string())),
                        label: (c[4].trim() != "1").then(|| {
                            format!(
                                "slot shared by {} values: {}",
                                &c[4],
                                shapes.chars().take(160).collect::<String>()
                            )
                        }),
                        allocation_type: Some("memory usage report".into()),
                        ..Allocation::default()
                    });
                }
                continue;
            }
        }
        if let Some(c) = pat.capacity.captures(t) {
            e.limit_bytes = e.limit_bytes.or(size(&c, 2));
            continue;
        }
        if let Some(c) = pat.total_usage.captures(t) {
            e.used_bytes = e.used_bytes.or(size(&c, 2));
            in_program = false;
            continue;
        }
        if let Some(c) = pat.program_req.captures(t) {
            e.program_bytes = size(&c, 2);
            in_program = true;
            continue;
        }
        if let Some(c) = pat.hlo_temp.captures(t) {
            e.hlo_temp_bytes = size(&c, 1);
            e.hlo_temp_unpadded_bytes = size(&c, 3);
            e.hlo_temp_padded_bytes = size(&c, 4);
            e.fragmentation_bytes = size(&c, 6);
            continue;
        }
        if let Some(c) = pat.kv_size.captures(t) {
            let v = size(&c, 2);
            match &c[1] {
                "reserved" if !in_program => e.reserved_bytes = v,
                "program" => e.program_bytes = e.program_bytes.or(v),
                "arguments" => e.arguments_bytes = v,
                "HLO temp" => e.hlo_temp_bytes = v,
                "parameter allocation" => e.arguments_bytes = v,
                "maybe_live_out allocation" => e.output_bytes = v,
                "preallocated temp allocation" => e.hlo_temp_bytes = v,
                "total allocation" => e.used_bytes = e.used_bytes.or(v),
                "total fragmentation" => e.fragmentation_bytes = v,
                _ => {}
            }
            continue;
        }
        if let Some(c) = pat.output_size.captures(t) {
            e.output_bytes = size(&c, 1);
            e.output_aliased_bytes = size(&c, 2);
            continue;
        }
        if pat.largest_header.is_match(t) || t.starts_with("Peak buffers") {
            in_largest = true;
            e.listing_header |= t.starts_with("Largest");
            continue;
        }
        if in_largest {
            if let Some(c) = pat
                .entry_size
                .captures(t)
                .or_else(|| pat.gpu_buffer.captures(t))
            {
                if let Some(a) = current.take() {
                    e.allocations.push(a);
                }
                current = Some(Allocation {
                    size_bytes: size(&c, 2).unwrap_or(0),
                    ..Allocation::default()
                });
                continue;
            }
            if let Some(c) = pat.field.captures(t).filter(|c| &c[1] == "Size") {
                // Entries whose `N. ` number was lost start with a bare `Size:`.
                if current.as_ref().is_none_or(|a| a.size_bytes != 0) {
                    if let Some(a) = current.take() {
                        e.allocations.push(a);
                    }
                    current = Some(Allocation {
                        size_bytes: parse_size(c[2].trim()).unwrap_or(0),
                        ..Allocation::default()
                    });
                    continue;
                }
            }
            if let (Some(c), Some(a)) = (pat.field.captures(t), current.as_mut()) {
                let value = c[2].trim();
                match &c[1] {
                    "Size" => a.size_bytes = parse_size(value).unwrap_or(a.size_bytes),
                    "Operator" => read_operator(a, value, pat),
                    "Shape" => a.shape = Some(value.to_string()),
                    "Entry Parameter Subshape" => {
                        a.shape = Some(value.to_string());
                        a.allocation_type = Some("Entry Parameter".into());
                    }
                    "Unpadded size" => a.unpadded_bytes = parse_size(value),
                    "XLA label" | "XLA Label" => a.label = Some(short_label(value)),
                    "Allocation type" => a.allocation_type = Some(value.to_string()),
                    _ => {}
                }
                continue;
            }
            if t.starts_with("=====") {
                if let Some(a) = current.take() {
                    e.allocations.push(a);
                }
                continue;
            }
        }
        if let Some(c) = pat.largest_free.captures(t) {
            e.largest_free_bytes = size(&c, 1);
        }
        if matches!(
            e.family,
            Family::BfcAllocator | Family::GpuOomAllocate | Family::TfOomTensor
        ) {
            let (mut limit, mut in_use, mut largest) = (None, None, None);
            read_bfc_stat(t, &mut limit, &mut in_use, &mut largest, pat);
            e.limit_bytes = e.limit_bytes.or(limit);
            e.used_bytes = e.used_bytes.or(in_use);
            e.largest_free_bytes = e.largest_free_bytes.or(largest);
        }
        if let Some(c) = pat.ptxla_post.captures(t) {
            ptxla = true;
            let gb = c[2]
                .parse::<f64>()
                .ok()
                .map(|v| (v * 1024f64.powi(3)).round() as u64);
            match &c[1] {
                "Graph input size" => e.arguments_bytes = e.arguments_bytes.or(gb),
                "Graph output size" => e.output_bytes = e.output_bytes.or(gb),
                "Aliased Input size" => e.output_aliased_bytes = e.output_aliased_bytes.or(gb),
                "Intermediate tensor size" => e.hlo_temp_bytes = e.hlo_temp_bytes.or(gb),
                _ => {}
            }
        }
        for c in pat.mem_info.captures_iter(t) {
            let v: Option<u64> = c[2].parse().ok();
            match &c[1] {
                "bytes_used" => e.used_bytes = e.used_bytes.or(v),
                "bytes_limit" => e.limit_bytes = e.limit_bytes.or(v),
                "kb_total" => e.limit_bytes = e.limit_bytes.or(v.map(|k| k * 1024)),
                "kb_free" => e.free_bytes = e.free_bytes.or(v.map(|k| k * 1024)),
                _ => {}
            }
        }
    }
    if let Some(a) = current.take() {
        e.allocations.push(a);
    }
    if e.allocations.is_empty() && !usage_rows.is_empty() {
        // Newer libtpu prints a memory usage report instead of "Largest program allocations".
        usage_rows.sort_by_key(|a| std::cmp::Reverse(a.size_bytes));
        usage_rows.truncate(20);
        e.allocations = usage_rows;
    }
    if e.partial
        && e.memory_space.is_none()
        && !e.allocations.is_empty()
        && saw_scoped
        && !e
            .allocations
            .iter()
            .any(|a| a.allocation_type.as_deref() == Some("HLO temp"))
    {
        // Scoped allocations live in vmem: a listing fragment made only of them is a vmem report.
        e.memory_space = Some(MemorySpace::Vmem);
        e.family = Family::TpuCompileVmem;
    }
    if ptxla && e.framework.is_none() {
        e.framework = Some(Framework::PytorchXla);
    }
    for a in &mut e.allocations {
        if a.unpadded_bytes.is_none() && e.backend != Some(Backend::Gpu) {
            // TPU listings omit "Unpadded size" only in old messages; GPU sizes are never padded.
            a.unpadded_bytes = a
                .shape
                .as_deref()
                .and_then(hbm_doctor_shape_bytes)
                .filter(|b| b.0 == a.size_bytes)
                .map(|b| b.1);
        }
        if a.unpadded_bytes.is_none()
            && (e.family == Family::GpuOomAllocate
                || a.allocation_type.as_deref() == Some("Entry Parameter"))
        {
            a.unpadded_bytes = Some(a.size_bytes);
        }
    }
}

/// Training progress printed before a runtime failure: the last step number, and whether an
/// evaluation or checkpoint was under way (a spike), in the lines just before the event.
fn read_progress(e: &mut Event, before: &[Line], pat: &Patterns) {
    if e.phase != Phase::Runtime {
        return;
    }
    for line in before.iter().rev().take(80) {
        let t = line.text.as_str();
        if e.step.is_none() {
            e.step = pat
                .step
                .captures(t)
                .and_then(|c| c.get(1).or(c.get(2))?.as_str().parse().ok());
        }
        if e.near.is_none() {
            e.near = progress_word(t).map(str::to_string);
        }
    }
}

/// What a progress line before a failure says was under way (`Evaluating...`, `Saving
/// checkpoint to ...`, `Compiling ...`): the word standing alone in prose, not inside an
/// identifier, a flag, a path or a dictionary key (`--checkpoint_dir`, `train_and_evaluate(`,
/// `--max-eval-instances`, `'checkpoint_info'`), and not on a line of code, a command or the
/// failure's own report (`Aborting and saving the final best model. Encountered exception:`).
fn progress_word(t: &str) -> Option<&'static str> {
    let lower = t.to_ascii_lowercase();
    let trimmed = lower.trim_start();
    let code = (lower.contains('(') && lower.contains('='))
        || trimmed.starts_with("python")
        || trimmed.starts_with('$')
        || trimmed.starts_with("file \"")
        || lower.contains("exception")
        || lower.contains("error");
    // The user's own sentence (`I've recompiled the catboost library`) is not a progress line.
    let first_person = lower.starts_with("i ")
        || [" i ", "i've", "i'm", "i have", " my ", " we "]
            .iter()
            .any(|k| lower.contains(k));
    // Nor is what an issue template or a config states: a heading or comment (`### eval`), the
    // environment's versions (`GCC/Compiler version (if compiling from source)`, nvcc's `Cuda
    // compilation tools`).
    let template = trimmed.starts_with('#')
        || lower.contains("version")
        || lower.contains("compilation tools")
        || lower.contains("if compiling");
    if code || first_person || template {
        return None;
    }
    let joined = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '\'');
    ["eval", "checkpoint", "saving", "recompil", "compiling"]
        .into_iter()
        .find(|k| {
            lower.match_indices(k).any(|(i, _)| {
                let before = lower[..i].chars().next_back();
                let word_end = lower[i..]
                    .find(|c: char| !c.is_ascii_alphabetic())
                    .map_or(lower.len(), |n| i + n);
                let after = lower[word_end..].chars().next();
                !before.is_some_and(joined) && !after.is_some_and(joined)
            })
        })
}

/// Words in a traceback frame (`File "...", line N, in NAME` and the code line under it) that say
/// what the program was doing. The deepest frame that names a stage wins: tracebacks list the
/// outermost call first, and `main -> train -> evaluate` failed in evaluation.
const STAGE_WORDS: &[(Stage, &[&str])] = &[
    (
        Stage::Restore,
        &[
            "restore",
            "load_checkpoint",
            "load_state_dict",
            "from_pretrained",
            "torch.load",
            "load_params",
            "load_pretrained",
            "load_model",
            "safetensors",
        ],
    ),
    (
        Stage::CheckpointSave,
        &[
            "save_checkpoint",
            "torch.save",
            "xm.save",
            "checkpointer.save",
            "save_state",
        ],
    ),
    (
        Stage::Generation,
        &[
            "generate",
            "decode",
            "beam_search",
            "greedy_search",
            "sample_tokens",
            "sampling",
            // Image, audio and structure generators' entry points (webui's `txt2img`, a
            // pipeline's `inference`, Keras' `predict`, whisper's `transcribe`).
            "txt2img",
            "img2img",
            "inference",
            "predict",
            "transcribe",
            "upscale",
        ],
    ),
    (Stage::Eval, &["eval", "validat", "valid_step", "test_step"]),
    (
        Stage::Init,
        &[
            "__init__",
            "in init",
            "init_fn",
            "initializ",
            "init_params",
            "init_state",
            "create_train_state",
            "device_put",
            ".to(device",
            ".to(xm.xla_device",
            ".cuda(",
            "replicate(",
            "param_init",
            "in setup",
            "model.init(",
        ],
    ),
    (
        Stage::Train,
        &[
            "train_step",
            "training_step",
            "train_batch",
            "train_on_batch",
            "update_step",
            "backward",
            "optimizer.step",
            "value_and_grad",
            "loss_fn",
            "train_loop",
            "in train",
            "in fit",
        ],
    ),
];

/// A path inside installed packages or a library's internals.
/// (Debian's `dist-packages` is not: Keras's own `in fit` frame there tells training.)
fn library_path(lower: &str) -> bool {
    lower.contains("site-packages") || lower.contains("/_src/")
}

/// The stage named by one traceback line, if any.
/// IPython's traceback frame (`/usr/lib/python3/dist-packages/keras/applications/resnet.py in
/// ResNet50(*args, **kwargs)`, `<ipython-input-35-1a3b> in <module>`): where its function name
/// starts.
fn ipython_frame(t: &str) -> Option<usize> {
    let i = t.find(".py in ").map(|i| i + 7).or_else(|| {
        t.starts_with("<ipython-input-")
            .then(|| t.find("> in ").map(|i| i + 5))
            .flatten()
    })?;
    (!t[..i - 4].contains(' ') || t.starts_with('<')).then_some(i)
}

/// A library's frame that names what the program was doing by its function: loading weights
/// (`load_weights`, `load_model`, `from_pretrained`, `load_state_dict`) restores them; a model
/// layer's constructor (`__init__` under a `models/`, `layers/` or `model_executor/` path: vLLM's
/// `vocab_parallel_embedding.py, line 76, in __init__`) creates the model.
fn library_frame_stage(lower: &str) -> Option<Stage> {
    let function = lower.rfind(", in ").map(|i| lower[i + 5..].trim())?;
    if [
        "load_weights",
        "load_model",
        "from_pretrained",
        "load_state_dict",
        "load_checkpoint",
    ]
    .contains(&function)
    {
        return Some(Stage::Restore);
    }
    let constructor_of_layers = ["/models/", "/layers/", "/model_executor/"]
        .iter()
        .any(|d| lower.contains(d));
    (function == "__init__" && constructor_of_layers).then_some(Stage::Init)
}

/// A frame inside a library's model zoo (`keras/applications/`, `torchvision/models/`): the
/// program is building a model.
fn model_zoo_frame(lower: &str) -> bool {
    [
        "keras/applications/",
        "keras_applications/",
        "torchvision/models/",
        "timm/models/",
    ]
    .iter()
    .any(|z| lower.contains(z))
}

fn stage_of(text: &str) -> Option<Stage> {
    let t = text.trim_start();
    let ipython = ipython_frame(t);
    let frame = t.starts_with("File \"") || ipython.is_some();
    if !frame && !t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        return None;
    }
    let lower = t.to_ascii_lowercase();
    // Library internals (`site-packages/jax/_src/...`) say nothing about the user's program,
    // but for a model zoo's constructors.
    if frame && model_zoo_frame(&lower) {
        return Some(Stage::Init);
    }
    if frame && library_path(&lower) {
        return library_frame_stage(&lower);
    }
    // Of a frame, only the function name counts (`generate.py` is a file, not a stage).
    let lower = if let Some(i) = ipython {
        format!("in {}", &lower[i..])
    } else if frame {
        match lower.rfind(", in ") {
            Some(i) => format!("in {}", &lower[i + 5..]),
            None => return None,
        }
    } else {
        lower
    };
    if !frame && (lower.contains(' ') && !lower.contains('(') || lower.len() > 200) {
        return None; // prose, not a code line
    }
    STAGE_WORDS
        .iter()
        .find(|(_, words)| words.iter().any(|w| lower.contains(w)))
        .map(|(s, _)| *s)
}

/// The operation the failure happened in: TensorFlow's node printed under the error, or the
/// code line of the last traceback frame just before it (or glued before the error on its line).
fn read_failing_op(e: &mut Event, before: &[Line], after: &[Line]) {
    if e.failing_op.is_some() {
        return;
    }
    let clip = |t: &str| t.trim().chars().take(200).collect::<String>();
    // TensorFlow: `[[Node: NAME = Op[...]`, `[[node NAME (defined at ...)`, `{{node NAME}}`.
    for l in after.iter().take(4) {
        let t = l.text.as_str();
        for key in ["[[Node: ", "[[node ", "{{node "] {
            if let Some(i) = t.find(key) {
                let name = t[i + key.len()..]
                    .split([' ', '}', ']'])
                    .next()
                    .unwrap_or("");
                if !name.is_empty() {
                    e.failing_op = Some(clip(name));
                    return;
                }
            }
        }
    }
    // Python: the code line under the last `File "...", line N, in f` frame, within the few
    // lines before the error (the error's own line may carry it, glued by a lost newline).
    let tail = &before[before.len().saturating_sub(4)..];
    for (k, l) in tail.iter().enumerate().rev() {
        let t = l.text.trim_start();
        if t.starts_with("File \"") {
            if let Some(code) = tail.get(k + 1) {
                let c = code.text.trim();
                // The code may share its line with the error (`return f(x)    torch.cuda.Out...`).
                let c = c.split("    ").next().unwrap_or(c);
                if !c.is_empty() && !c.starts_with("File \"") {
                    e.failing_op = Some(clip(c));
                }
            }
            return;
        }
    }
    // A code line glued before the error on its own line, no frame kept (`return
    // torch._C._nn.cross_entropy_loss(...)      torch.cuda.OutOfMemoryError: ...`).
    if let Some(l) = before.last() {
        let t = l.text.trim();
        if let Some((code, _)) = t.split_once("    ") {
            let code = code.trim();
            if code.starts_with("return ") || code.contains(" = ") {
                e.failing_op = Some(clip(code));
            }
        }
    }
}

/// What the program was doing: the deepest traceback frame (and its code line) that names a
/// stage, before the event or in the report lines after it.
fn read_stage(e: &mut Event, before: &[Line], after: &[Line]) {
    let start = before.len().saturating_sub(LOOKBEHIND_STAGE_LINES);
    let mut found = None;
    let mut after_frame = false;
    for line in before[start..]
        .iter()
        .chain(after.iter().take(LOOKAHEAD_STAGE_LINES))
    {
        let t = line.text.trim_start();
        let frame = t.starts_with("File \"") || ipython_frame(t).is_some();
        // A frame line, or the code line printed under it.
        if frame || after_frame {
            if let Some(s) = stage_of(t) {
                found = Some(s);
            }
        }
        let lower = t.to_ascii_lowercase();
        after_frame = frame && !library_path(&lower);
    }
    // TensorFlow's graph names the op that failed (`[[Node: embeddings/Adam/Initializer/zeros
    // = Const[...]`, TF 1.13's `[[node model/lookup_table/Adam/Initializer/zeros (defined at
    // ...)`, `[[{{node dense/kernel/Initializer/random_uniform}}]]`): a variable's
    // initializer runs when the model's state is created.
    if found.is_none() {
        let node_init = |t: &str| {
            (t.contains("[[Node:") || t.contains("[[node ") || t.contains("{{node "))
                && t.contains("/Initializer/")
        };
        if before[start..]
            .iter()
            .chain(after.iter().take(8))
            .any(|l| node_init(&l.text))
        {
            found = Some(Stage::Init);
        }
    }
    // The library's own frames say it where the user's do not: PyTorch's `Module.to` / `.cuda()`
    // moving the model's parameters to the device (`return t.to(device, dtype if
    // t.is_floating_point() or t.is_complex() else None, non_blocking)`, `param_applied =
    // fn(param)`, `return self._apply(lambda t: t.cuda(device))`), or Hugging Face's progress
    // bar of the weights being loaded (`Loading checkpoint shards:`) just before the failure.
    if found.is_none() {
        let lines = &before[before.len().saturating_sub(12)..];
        let has = |k: &str| lines.iter().any(|l| l.text.contains(k));
        if has("t.is_floating_point() or t.is_complex()")
            || has("param_applied = fn(param)")
            || has("lambda t: t.cuda(")
        {
            found = Some(Stage::Init);
        } else if has("Loading checkpoint shards") {
            found = Some(Stage::Restore);
        }
    }
    // No frame says it: the user's own words may ("I am not able to load the 2.7B model",
    // "crashes when loading the checkpoint").
    if found.is_none() {
        found = before[start..]
            .iter()
            .chain(after.iter().take(LOOKAHEAD_STAGE_LINES))
            .find_map(|l| prose_stage(&l.text));
    }
    // Nor a sentence: the command the user ran may (`python scripts/txt2img.py --prompt ...`,
    // `torchrun train_lora.py`). The last command before the event counts, else the first after.
    if found.is_none() {
        found = before[start..]
            .iter()
            .rev()
            .chain(after.iter().take(LOOKAHEAD_STAGE_LINES))
            .find_map(|l| command_stage(&l.text));
    }
    e.stage = e.stage.or(found);
}

/// The stage a command line's script names: `python [-m pkg.]NAME.py`, `torchrun ... NAME.py`,
/// `accelerate launch NAME.py`, `deepspeed NAME.py`, `!python NAME.py` in a notebook. A script
/// named for training (`train.py`, `finetune_lora.py`, `run_sft.py`) runs training steps; one
/// named for evaluation evaluates; one named for inference (`txt2img.py`, `inference.py`,
/// `demo.py`, `predict.py`, `cli_demo.py`, `app.py`) generates. `test.py` says neither (a test
/// set or a unit test).
fn command_stage(t: &str) -> Option<Stage> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !t.contains(".py") {
        return None;
    }
    let re = RE.get_or_init(|| {
        Regex::new(
            r"^\s*(?:[$>!%]\s*|\(\S+\)\s*\$?\s*)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:python[\d.]*(?:\s+-u)?|torchrun|accelerate\s+launch|deepspeed)\b[^\n]*?(?:^|[\s/])([A-Za-z][\w-]*)\.py\b",
        )
        .expect("command stage pattern")
    });
    let name = re.captures(t)?.get(1)?.as_str().to_ascii_lowercase();
    let has = |keys: &[&str]| keys.iter().any(|k| name.contains(k));
    if has(&[
        "train", "finetun", "fine_tun", "fine-tun", "pretrain", "sft", "dpo",
    ]) {
        Some(Stage::Train)
    } else if has(&["eval", "valid", "benchmark"]) {
        Some(Stage::Eval)
    } else if has(&[
        "infer",
        "predict",
        "demo",
        "sample",
        "generat",
        "txt2img",
        "img2img",
        "inpaint",
        "synthes",
        "transcrib",
        "chat",
        "webui",
    ]) || name == "app"
    {
        Some(Stage::Generation)
    } else {
        None
    }
}

/// A stage a sentence states: failing while loading a model, its weights or a checkpoint.
fn prose_stage(t: &str) -> Option<Stage> {
    static LOAD: OnceLock<Regex> = OnceLock::new();
    static EVAL: OnceLock<Regex> = OnceLock::new();
    // `cuda out of memory will appear during the validation process`: the failure told to come
    // while evaluating.
    // `on validatation phase` (sic), or the user's evaluation method named (`for the epochVal
    // method`, `in my eval_step function`).
    if t.contains("val") || t.contains("Val") {
        let re = EVAL.get_or_init(|| {
            Regex::new(r"(?i:(?:during|while|when|in|on|at|after)\s+(?:the\s+|my\s+)?(?:validation|validating|validatation|evaluation|evaluating|val|eval)\b)|(?i:\b(?:the|my)\s+(?:validation|evaluation)\s+(?:loop|phase|step|stage)\b)|\b\w*(?:Val|_val|val_|Eval|eval_|_eval|valid)\w*\s+(?:method|function|phase|step|loop)\b")
                .expect("prose stage pattern")
        });
        let code = t.contains('(') && t.contains('=');
        if !code && re.is_match(t) {
            return Some(Stage::Eval);
        }
    }
    if let Some(s) = prose_when(t) {
        return Some(s);
    }
    if !t.contains("load") && !t.contains("Load") {
        return None;
    }
    let re = LOAD.get_or_init(|| {
        Regex::new(
            r"(?i)\b(?:fail\w*|unable|not able|cannot|can't|can not|crash\w*|error|when|while|during|trying to|try to|tried to)\b[^\n]{0,24}\bload(?:ing)?\b(?:(?:\s+\S+){0,6}?\s+(?:model|weights|checkpoint|parameters)\b|\s+(?:the\s+|a\s+|my\s+)?[a-z][\w.-]*?-?\d+(?:\.\d+)?[bm]\b)|\bload(?:s|ing)?\s+(?:it|them|(?:the|a|my)\s+(?:\w+\s+)?(?:model|weights|checkpoint|generator|pipeline))\b[^.;]{0,60}?\b(?:crash(?:es|ed)?|oom|out of memory|killed|gives\s+me\s+(?:an?\s+)?oom)\b|\btorch\.load\b[^;]{0,60}?\b(?:raises|throws|crash\w*|oom|out of memory)",
        )
        .expect("prose stage pattern")
    });
    // Code is not prose: `model = load_model(...)`.
    let code = t.contains('(') && t.contains('=');
    (!code && re.is_match(t)).then_some(Stage::Restore)
}

/// What the run was doing, as a sentence tells it: inference (`when running inference`,
/// `generating images`, `txt2img`), a training step (`when I start training`, `the first
/// epoch`, `after a few epochs`, `at the 170th epoch`), or the model being set up (`when creating
/// the model`, `at startup`, `启动的时候`; loading one is `prose_stage`'s restore). Code lines are
/// not sentences.
fn prose_when(t: &str) -> Option<Stage> {
    static RES: OnceLock<[Regex; 3]> = OnceLock::new();
    let quick = [
        "infer",
        "Infer",
        "generat",
        "Generat",
        "sampling",
        "decoding",
        "predict",
        "synthesi",
        "steps",
        "upscal",
        "transcrib",
        "txt2img",
        "img2img",
        "train",
        "Train",
        "epoch",
        "Epoch",
        "step",
        "iteration",
        "startup",
        "start-up",
        "to start",
        "starting",
        "loading",
        "initiali",
        "启动",
        "加载",
        "推理",
        "训练",
    ];
    if !quick.iter().any(|k| t.contains(k)) {
        return None;
    }
    // Code, a command line or a machine-written line is not the user's sentence.
    let code = (t.contains('(') && t.contains('='))
        || t.trim_start()
            .starts_with(['$', '>', '#', '-', '[', '{', '|']);
    if code || t.contains("--") || t.contains("File \"") {
        return None;
    }
    let [generation, train, init] = built_in(
        &RES,
        [
            r"(?i)\b(?:(?:running|run|runs|do|doing|during|for|at|when|while)\s+(?:the\s+|an?\s+|model\s+)?inference\b|inferenc(?:e|ing)\s+(?:on|with)\b|(?:when|while|during)\s+(?:generating|sampling|decoding|predicting|upscaling|transcribing)\b|generat(?:e|ing)\s+(?:an?\s+|the\s+|\w+\s+)?(?:images?|pictures?|textures?|text|videos?|audio|speech|tokens|responses?|samples?)\b|\btxt2img\b|\bimg2img\b|(?:try|trying|tried|when\s+i|while\s+i)\s+(?:to\s+)?(?:predict|generate|synthesi[sz]e|transcribe|upscale|infer)\b|\brunning\s+(?:the\s+)?predictions?\b|\d+\s*steps\b[^.]{0,40}\b(?:cfg|euler|sampler|ddim|dpm)|\b(?:cfg|euler|sampler|ddim)\b[^.]{0,40}\d+\s*steps\b)|推理",
            r"(?i)\b(?:(?:when|while|during|once)\s+(?:i\s+|we\s+)?(?:start(?:ing|ed)?\s+|begin(?:ning)?\s+)?(?:the\s+)?training\b|start(?:s|ed|ing)?\s+(?:to\s+)?train(?:ing)?\b|(?:in|at|during|on)\s+the\s+first\s+(?:epoch|step|batch|iteration)|(?:after|up\s+to)\s+(?:about\s+|around\s+|roughly\s+|nearly\s+|~\s*)?(?:a\s+while|some\s+time|a\s+few|few|several|many|some|so\s+many|\d[\d,.]*k?)\s+(?:training\s+)?(?:steps|iterations|iters|epochs|batches|hours)\b|(?:at|reach(?:es|ed|ing)?)\s+(?:the\s+)?\d+(?:st|nd|rd|th)\s+(?:epoch|step|iteration)\b|(?:at|in)\s+(?:epoch|step|iteration)\s+\d+)|训练时|训练的时候|开始训练",
            r"(?i)\b(?:(?:when|while|during)\s+(?:initiali[sz]ing|creating|building|instantiating)\s+(?:the\s+|my\s+|a\s+)?(?:\w+\s+)?model\b|(?:at|on|during)\s+start-?up\b|\btraining\s+initiali[sz]ation\b|fail(?:s|ed)?\s+(?:at|during)\s+(?:the\s+)?initiali[sz]ation\b|fail(?:s|ed)?\s+to\s+start\s+(?:the\s+)?(?:\w+\s+){0,2}(?:server|engine|service|worker)s?\b|(?:when|while)\s+starting\s+(?:the\s+|an?\s+)?(?:\w+\s+){0,2}(?:server|engine|service)\b)|启动的时候|启动时|加载模型",
        ],
    );
    if generation.is_match(t) {
        Some(Stage::Generation)
    } else if init.is_match(t) {
        Some(Stage::Init)
    } else if train.is_match(t) {
        Some(Stage::Train)
    } else {
        None
    }
}

/// Lines before an event searched for its traceback.
const LOOKBEHIND_STAGE_LINES: usize = 80;
/// Lines after an event searched for its traceback (logs that print the error before it).
const LOOKAHEAD_STAGE_LINES: usize = 200;

fn read_bfc_stat(
    t: &str,
    limit: &mut Option<u64>,
    in_use: &mut Option<u64>,
    largest_free: &mut Option<u64>,
    pat: &Patterns,
) {
    let Some(s) = pat.bfc_stat.captures(t) else {
        return;
    };
    let v = parse_size(&s[2]).or_else(|| s[2].trim().parse().ok());
    match &s[1] {
        "Limit" => *limit = v,
        "InUse" => *in_use = v,
        "LargestFreeBlock" => *largest_free = v,
        _ => {}
    }
}

fn read_operator(a: &mut Allocation, value: &str, pat: &Patterns) {
    a.op_name = pat.op_name.captures(value).map(|c| c[1].to_string());
    a.op_type = pat.op_type.captures(value).map(|c| c[1].to_string());
    let file = pat.source_file.captures(value).map(|c| c[1].to_string());
    let line = pat.source_line.captures(value).map(|c| c[1].to_string());
    a.source = match (file, line) {
        (Some(f), Some(l)) => Some(format!("{f}:{l}")),
        (Some(f), None) => Some(f),
        _ => None,
    };
    if a.op_name.is_none() && !value.contains('=') {
        a.op_name = Some(value.to_string());
    }
}

/// `%copy.40488 = s32[...] copy(...), metadata={...}` -> `copy.40488`; short labels stay as they are.
fn short_label(value: &str) -> String {
    let v = value.trim();
    match v.find(" = ") {
        Some(i) if !v[..i].contains(' ') => v[..i].trim_start_matches('%').to_string(),
        _ => v.chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use crate::{scan_all, Family, Framework, MemorySpace, Stage, WarningKind};

    #[test]
    fn framework_from_the_package_not_a_directory_named_like_one() {
        let jax = b"Traceback (most recent call last):\n  File \"/opt/torch/.venv/lib/python3.12/site-packages/jax/_src/api.py\", line 2790, in block_until_ready\n    xc.batched_block_until_ready(arrays)\njax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 23.50GiB with allocator GPU_0_bfc on device 0.\n";
        let ev = scan_all(jax);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].framework, Some(Framework::Jax));
        let torch = b"  File \"/opt/jax/venv/lib/python3.10/dist-packages/torch_xla/core/xla_model.py\", line 1, in mark_step\nRuntimeError: RESOURCE_EXHAUSTED: Attempting to allocate 1.00G. That was not possible. There are 512.00M free.\n";
        assert_eq!(scan_all(torch)[0].framework, Some(Framework::PytorchXla));
        let tf = b"  File \"/home/u/torch/env/lib/python3.8/site-packages/tensorflow/python/eager/execute.py\", line 54\ntensorflow.python.framework.errors_impl.ResourceExhaustedError: Attempting to allocate 1.00G. That was not possible. There are 512.00M free.\n";
        assert_eq!(scan_all(tf)[0].framework, Some(Framework::Tensorflow));
        assert_eq!(
            super::installed_paths("at /opt/torch/.venv/lib/python3.12/site-packages/jax/_src/api.py:1 and \"/usr/lib/python3/dist-packages/numpy/x.py\""),
            "at jax/_src/api.py:1 and \"numpy/x.py\""
        );
        assert!(super::starts_a_path(
            "File \"torch/nn/functional.py\"",
            "torch/"
        ));
        assert!(!super::starts_a_path(
            "File \"/opt/torch/train.py\"",
            "torch/"
        ));
    }

    #[test]
    fn a_failure_told_in_the_first_person_is_an_event_and_talk_is_not() {
        for told in [
            "For example, when I use TransE, everything goes fine. When I change to DistMult, the memory increases every epoch and after some epochs I receive a OOM error.\n",
            "I assigned the device as following (in train.py, test.py, detect.py are similar), but it always OOM.\n",
            "There appears to be a memory leak since the GPU I'm using (A40, 48 GB VRAM) runs out of memory from training for 125 epochs.\n",
            // Any phrasing, when the sentence is the user's own (prose_failure).
            "However, after run about two days I saw it stopped because of OOM error.\n",
            "I cropped 800x800, overlap=200, and get oom for a few steps(~ 300).\n",
            // A sentence that introduces a log which was not pasted still tells the failure.
            "Yes even with BF16 I get the OOM error. Here is how the log looks like.\n",
            // A negation in another clause: the user's own clause tells the failure.
            "I tried different configurations but it doesn't work as I get an OOM error.\n",
            "파라미터 값을 키울 경우 다음과 같이 cuda out of memory가 뜨는 것을 확인했습니다.\n",
        ] {
            let ev = scan_all(told.as_bytes());
            assert_eq!(ev.len(), 1, "{told}");
            assert!(ev[0].fatal);
        }
        for talk in [
            "The CI tests frequently fail with CUDA out of memory errors.\n",
            "This PR fixes the OOM error we get with long prompts.\n",
            "If you get an OOM error, reduce the batch size.\n",
            "This change avoids the OOM we saw at step 10 on 8 GPUs.\n",
            "Lower the batch size of the example.\n\nWe saw OOM failures in the nightly tests on my machine.\n\n## Summary\n",
            "Does this model run out of memory on a 16 GB card?\n",
            "It's not running out of memory, the process exits with code 1.\n",
        ] {
            assert!(scan_all(talk.as_bytes()).is_empty(), "{talk}");
        }
        // A failure told in words gives way to the one printed after it.
        let ev = scan_all(b"After a few steps I got an OOM error.\nRuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.93 GiB total capacity; 11.07 GiB already allocated; 19.75 MiB free; 11.36 GiB reserved in total by PyTorch)\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::PytorchCudaOom);
    }

    #[test]
    fn only_the_clause_that_tells_the_failure_is_weighed() {
        for told in [
            // A negation in a clause before or after the failure's own.
            "When I ran the large config, I hit a 'CUDA out of memory' error, despite the input not being long.\n",
            "The small model trains fine if I keep 4 envs - but with 64 envs it runs out of memory - is there a way out?\n",
            // The failure's own words are no negation (`not enough RAM`).
            "From the log I understand there is not enough RAM to train, please tell me if I am wrong.\n",
            // Verbs of a failure met, and a failure that happened.
            "The eval step is fine, but an OOM error is reported at the decode, even if I lower the tile size.\n",
            "When the queue runs a second time it prompts CUDA out of memory again.\n",
            "The encoder works fine but it fails with the same OOM error as above under accelerate.\n",
            "On the second node the job ran out of memory, and the message does not say so.\n",
            "During training, the first epochs were fine, but suddenly OOM happened.\n",
            "Even with one env my run fails to start, complaining about GPU memory overflow.\n",
        ] {
            let ev = scan_all(told.as_bytes());
            assert_eq!(ev.len(), 1, "{told}");
            assert!(ev[0].fatal, "{told}");
        }
        for talk in [
            // A program's known behaviour, a fix's past state, a quoted warning that is none.
            "This example is tested in CI, and OOMs unless we train with the memory saving option.\n",
            "The new kernel passed the test; the previous implementation OOMed on a 5 GiB allocation.\n",
            "\"ran out of memory trying to allocate 570.66MiB. The caller indicates that this is not a failure, but may mean that there could be performance gains.\"\n",
            "Should be more stable: we ran into an OOM on validation when the train batch was large.\n\n## 🛠️ PR Summary\nAdjusted the batch size.\n",
        ] {
            assert!(scan_all(talk.as_bytes()).is_empty(), "{talk}");
        }
    }

    #[test]
    fn a_run_told_in_the_third_person_or_in_chinese_is_an_event() {
        for told in [
            "The program got OOM before the training began. Did we miss something?\n",
            "We ran the v3-8 config again and it did with OOM.\n",
            "With the 1.0.0 version FPN(resnet34) FPN(resnet18) do OOM.\n",
            "However, it shows Cuda out-of-memory error even with setting batch size as 1.\n",
            "可是却出现了OOM，想知道问题出在哪里\n",
            "但出现了CUDA内存不足的问题，见下图。\n",
            // Korean and Japanese: the failure's words, then the verb that it happened.
            "3000개 정도 되는 문장 리스트에 대해 임베딩을 시도하면 OOM 문제가 발생합니다.\n",
            "学習を始めるとすぐにOOMが発生しました。\n",
            // Typed into an issue form's heading; the doubt about the cause, not the failure.
            "### During the training, there was no problem with the first few epoch, but suddenly OOM happened.\n",
            "I have nothing else running so I'm not sure why the machine is running out of memory.\n",
        ] {
            let ev = scan_all(told.as_bytes());
            assert_eq!(ev.len(), 1, "{told}");
            assert!(ev[0].fatal && ev[0].told, "{told}");
        }
        // The machine's memory is the host's, whatever accelerator the line names.
        let host = scan_all(
            b"I set up for TPU and I'm not sure why the machine is running out of memory.\n",
        );
        assert_eq!(host[0].memory_space, Some(crate::MemorySpace::Host));
        // PyTorch's host allocator quoted without its figure, inside a question.
        let cpu = scan_all("  Hello, when I run gnn.py, this error （RuntimeError: [enforce fail at CPUAllocator.cpp:67] . DefaultCPUAllocator: can't allocate memory）appears when converting the adjacency matrix. How should I modify the code to run on my device ？\n".as_bytes());
        assert_eq!(cpu.len(), 1);
        assert_eq!(cpu[0].memory_space, Some(crate::MemorySpace::Host));
        for talk in [
            // Other people, a kind of case, a condition, a question, a remedy.
            "Users on 12GB VRAM cards (e.g. RTX 3060) hit OOM on the video VAE decode.\n",
            "It adds tests for Conv2d operations that fail with OOM errors.\n",
            "If the training gets OOM, the script retries with half the batch.\n",
            "Does it get OOM on a T4?\n",
            "如何避免出现OOM\n",
            "OOM이 발생하는 경우에는 어떻게 해야 하나요?\n",
            "OOMが発生しないようにするにはどうすればいいですか？\n",
            "It doesn't run out of memory as I reduced the batch.\n",
            "The CI tests frequently fail with CUDA out of memory errors.\n",
            "if the gt boxes of one image reach 300, we often get GPU out of memory errors.\n",
        ] {
            assert!(scan_all(talk.as_bytes()).is_empty(), "{talk}");
        }
    }

    #[test]
    fn gpu_peak_buffers_pasted_without_header_or_headline() {
        let text = b"Vmap used here limits the device memory.\n```\nBuffer 1:\nSize: 34.57GiB\nOperator: op_name=\"jit(xsmatrix_first)/jit(main)/broadcast_in_dim\"\nXLA Label: broadcast\nShape: c128[40,11,100,52729]\n==========================\n\nBuffer 2:\nSize: 34.57GiB\nXLA Label: fusion\nShape: c128[11,40,100,52729]\n==========================\n```\n";
        let ev = scan_all(text);
        assert_eq!(ev.len(), 1, "{ev:?}");
        let e = &ev[0];
        assert!(e.partial);
        assert_eq!(e.line, 3);
        assert_eq!(e.backend, Some(crate::Backend::Gpu));
        assert_eq!(e.framework, Some(Framework::Jax));
        assert_eq!(e.allocations.len(), 2);
        assert_eq!(
            e.allocations[0].size_bytes,
            crate::size::parse_size("34.57GiB").expect("size")
        );
        // A sentence naming the failure's cause: one failure, even in the plural.
        let told =
            b"The GPU option takes 4-5 hours but always crashes at 100% due to OOM errors.\n";
        assert_eq!(scan_all(told).len(), 1);
        let talk = b"These tests fail with OOM errors on small runners.\n";
        assert!(scan_all(talk).is_empty());
    }

    #[test]
    fn warp_arrays_and_pytorch_pasted_from_tried_to_allocate() {
        let warp = b"RuntimeError: Array allocation failed on device: cuda:0 for 16777216 bytes\n";
        let e = super::told_failure(warp).expect("event");
        assert_eq!(e.requested_bytes, Some(16_777_216));
        assert_eq!(e.device.as_deref(), Some("cuda:0"));
        let cut = b"d3rlpy fails after a while:\nTried to allocate 186.00 MiB (GPU 0; 9.78 GiB total capacity; 8.52 GiB already allocated; 95.19 MiB free; 8.63 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory, try setting max_split_size_mb to avoid fragmentation.\n";
        let ev = scan_all(cut);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::PytorchCudaOom);
        assert_eq!(ev[0].limit_bytes, crate::size::parse_size("9.78 GiB"));
        let quoted = b"On a Tesla T4, I got  CUDA Out of Memory error message (Pubmed dataset). `Tried to allocate 1.45 GiB (GPU 0; 14.73 GiB total capacity; 13.08 GiB already allocated; 785.88 MiB free; 13.08 GiB reserved in total by PyTorch).`\n";
        let ev = scan_all(quoted);
        assert_eq!(ev[0].limit_bytes, crate::size::parse_size("14.73 GiB"));
        let ms = b"[ERROR] PRE_ACT(54175,fffdbcff91e0,python):2024-10-22-11:24:55.301.443 [mindspore/ccsrc/backend/common/mem_reuse/mem_dynamic_allocator.cc:392] AddMemBlockAndMemBufByEagerFree] TotalUsedMemStatistics : 29356337664 plus TotalUsedByEventMemStatistics : 0 and plus alloc size : 301990400 is more than total mem size : 29464985600.\n";
        let e = super::told_failure(ms).expect("event");
        assert_eq!(e.family, Family::OtherAccelerator);
        assert_eq!(
            (e.used_bytes, e.requested_bytes, e.limit_bytes),
            (
                Some(29_356_337_664),
                Some(301_990_400),
                Some(29_464_985_600)
            )
        );
        // A sentence quoting the words is not the message.
        assert!(scan_all(b"The trainer tried to allocate a large buffer.\n").is_empty());
    }

    #[test]
    fn progress_and_steps_told_in_prose() {
        let graf = b"However, After this log\n`[cub_64 epoch 7, it 7990, t 1.099] g_loss = 1.0365`,\nI got\n`RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 11.91 GiB total capacity; 10.89 GiB already allocated; 1.06 MiB free; 11.29 GiB reserved in total by PyTorch)`\n";
        assert_eq!(scan_all(graf)[0].step, Some(7990));
        for told in [
            "here training crashed consistently after about 9k steps of training",
            "CUDA out of memory when it reach 23th epoch",
            "I get out of memory when I run it up to about 1500 steps on RTX 3090.",
        ] {
            assert_eq!(super::prose_when(told), Some(Stage::Train), "{told}");
        }
        let mlx = b"RuntimeError: [metal::malloc] Resource limit (499000) exceeded.\n";
        let e = super::told_failure(mlx).expect("event");
        assert_eq!(e.family, Family::OtherAccelerator);
        assert_eq!(e.requested_bytes, None);
    }

    #[test]
    fn llm_engines_refusing_to_start_and_metal_command_buffers() {
        let ev = super::told_failure(b"RuntimeError                              Traceback (most recent call last)\n---> 12 model.load_autosplit(cache)\nRuntimeError: Insufficient VRAM for model and cache\n");
        assert_eq!(ev.map(|e| e.backend), Some(Some(crate::Backend::Gpu)));
        let trt = b"trtllm-serve crashes because of gpu oom as follows\n```\n[07/08/2025-19:47:15] [TRT-LLM] [RANK 1] [E] Failed to initialize executor on rank 1: Executor creation failed due to insufficient GPU memory.\n\nThe following component could not be created: KV cache\nTotal GPU memory (GiB): 140.06\nFree GPU memory before component creation attempt (GiB): 108.86\n";
        let e = super::told_failure(trt).expect("event");
        assert!(
            e.message.contains("Executor creation failed"),
            "{}",
            e.message
        );
        assert_eq!(e.limit_bytes, crate::size::parse_size("140.06 GiB"));
        assert_eq!(e.free_bytes, crate::size::parse_size("108.86 GiB"));
        let metal = b"libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)\n";
        let e = super::told_failure(metal).expect("event");
        assert_eq!(e.family, Family::OtherAccelerator);
        assert_eq!(e.device.as_deref(), Some("metal"));
        let cjk = "设置tp=4，持续运行时显存一直缓慢增长直到oom，以下是模型配置参数".as_bytes();
        assert!(super::told_failure(cjk).is_some());
    }

    #[test]
    fn messages_of_other_runtimes_with_their_figures() {
        let ev = scan_all(b"TVMError: Check failed: (output_res.IsOk()) is false: Insufficient GPU memory error: The available single GPU memory is 20584.716 MB, which is less than the sum of model weight size (5977.188 MB) and temporary buffer size (15013.765 MB).\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].free_bytes, crate::parse_size("20584.716 MB"));
        let ev = scan_all(
            b"[bmlib_memory][error] bm_alloc_gmem failed, dev_id = 0, size = 0xc0fb4000\n",
        );
        assert_eq!(ev[0].requested_bytes, Some(0xc0fb4000));
        let ev = scan_all(b"newBufferWith*:length 0x86004000 must not exceed 2048 MB.\n");
        assert_eq!(ev[0].requested_bytes, Some(0x86004000));
        assert_eq!(ev[0].limit_bytes, Some(2048 << 20));
        let ev =
            scan_all(b"tcmalloc: large alloc 113702387720192 bytes == (nil) @  0x7f6a2b8f1680\n");
        assert_eq!(ev[0].requested_bytes, Some(113702387720192));
        assert_eq!(ev[0].memory_space, Some(MemorySpace::Host));
        // A large allocation that succeeded is only logged.
        assert!(scan_all(
            b"tcmalloc: large alloc 12884901888 bytes == 0x7f8880000000 @ 0x7f94b4551001\n"
        )
        .is_empty());
        let ev = scan_all(b"2024-Oct-15 18:01:17.728750  3882:3882  ERROR  TDRV:dmem_alloc_internal   Failed to alloc DEVICE memory: 180355072\n2024-Oct-15 18:01:18.347720  3882:3882  ERROR  TDRV:log_dev_mem   Failed to allocate 172.000MB (usage: tensors) on ND 0:NC 0, current utilization:\n\t* total: 15.855GB\n\t* tensors: 15.855GB\n");
        assert_eq!(ev.iter().filter(|e| e.fatal).count(), 1);
        assert_eq!(ev[0].requested_bytes, Some(180355072));
        assert_eq!(ev[0].used_bytes, crate::parse_size("15.855GB"));
        let ev = scan_all(b"[GCA035]  Instruction: I-21-0 with opcode: TensorTensor couldn't be allocated in SB\nMemory Location Accessed:\nTotal Accessed Bytes per partition by instruction: 198024\nTotal SB Partition Size: 196608\n");
        assert_eq!(
            (ev[0].used_bytes, ev[0].limit_bytes),
            (Some(198024), Some(196608))
        );
        assert_eq!(ev[0].memory_space, Some(MemorySpace::Vmem));
        let ev = scan_all(b"popart_exception: Out of memory. Single stream of length 149766584 in bufferIndex 1\n");
        assert_eq!(ev[0].requested_bytes, Some(149766584));
        let ev = scan_all(b"RuntimeError: Current platform can NOT allocate memory block with size larger than 4GB! Tried to allocate 7.62 GiB (GPU  0; 15.11 GiB total capacity; 334.79 MiB already allocated; 474.00 MiB reserved in total by PyTorch)\n");
        assert_eq!(ev[0].requested_bytes, crate::parse_size("7.62 GiB"));
        assert_eq!(ev[0].limit_bytes, crate::parse_size("15.11 GiB"));
        let ev = scan_all(b"\"Could not allocate tensor with 81544192 bytes. There is not enough GPU video memory available!\"\n");
        assert_eq!(ev[0].requested_bytes, Some(81544192));
        // Runtimes and fleets beyond ML frameworks.
        let ev = scan_all(b"2023-09-05 10:42:40.81 [E:onnxruntime:, sequential_executor.cc:494 ExecuteKernel] Non-zero status code returned while running ConvTranspose node. Status Message: bfc_arena.cc:376 onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 33554432\n");
        assert_eq!(ev.iter().filter(|e| e.fatal).count(), 1);
        assert_eq!(ev[0].requested_bytes, Some(33554432));
        let ev = scan_all(b"slurmstepd: error: Detected 1 oom-kill event(s) in StepId=15043231.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.\n");
        assert_eq!(ev[0].family, Family::HostOom);
        let ev = scan_all(b"ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.7, ID: ab12) where the task was running was 59.49GB / 62.58GB (0.950744), which exceeds the memory usage threshold of 0.95.\n");
        assert_eq!(ev[0].memory_space, Some(MemorySpace::Host));
        assert_eq!(ev[0].limit_bytes, crate::parse_size("62.58GB"));
        let ev = scan_all(b"[GPU] Exceeded max size of memory object allocation: requested 7516192768 bytes, but max alloc size supported by device is 4294959104 bytes. Please try to reduce batch size.\n");
        assert_eq!(ev[0].requested_bytes, Some(7516192768));
        let ev = scan_all(b"terminate called after throwing an instance of 'std::bad_alloc' what():  std::bad_alloc\n");
        assert_eq!(ev[0].family, Family::HostOom);
        // A printed message further down wins over a sentence telling the failure.
        let ev = scan_all(b"I'm getting OOM errors even with small files.\nTraceback (most recent call last):\n  File \"walk.py\", line 3, in <module>\nMemoryError\n");
        assert_eq!(ev[0].family, Family::HostOom);
        let ev = scan_all(b"OutOfMemoryError                          Traceback (most recent call last)\nCell In[12], line 3\n");
        assert_eq!(ev[0].family, Family::PytorchCudaOom);
        for killed in [
            "[1]    1819 killed    python3 dddqn_train.py results\n",
            "[ERROR] [launch.py:325:sigkill_handler] ['python', '-u', 'train.py'] exits with return code = -9\n",
            "  exitcode  : -9 (pid: 1234)\n",
        ] {
            let ev = scan_all(killed.as_bytes());
            assert_eq!(ev.len(), 1, "{killed}");
            assert_eq!(ev[0].family, Family::HostOom, "{killed}");
        }
    }

    #[test]
    fn resource_exhausted_that_is_not_memory() {
        for text in [
            "    \"status\": \"RESOURCE_EXHAUSTED\"\n",
            "W tensorflow/core/framework/op_kernel.cc:1745] OP_REQUIRES failed at io_kernel.h:71 : RESOURCE_EXHAUSTED: /data/part-39607.c000.snappy.parquet; Too many open files\n",
            "The Resource exhausted error happen after at least 46831 trainning steps, since i can see the last check point file.\n",
        ] {
            assert!(scan_all(text.as_bytes()).is_empty(), "{text}");
        }
    }

    #[test]
    fn figure_less_messages_named_by_their_family() {
        let ev = scan_all(b"Unfortunately, after ~2 epochs I keep getting CUDA out of memory.\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::PytorchCudaOom);
        let ev = scan_all(b"ResourceExhaustedError                    Traceback (most recent call last)\n<ipython-input-35-1a3bbd5216b5> in <module>\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::TfOomTensor);
        assert_eq!(ev[0].framework, Some(Framework::Tensorflow));
    }

    #[test]
    fn an_error_code_named_in_a_sentence_is_talk() {
        let talk = b"The kernel needs ~33.6 MiB of scoped VMEM, which exceeds the 32 MiB default and fails compilation with `E1001: CompileTimeScopedVmemOom` on every cold-cache run.\n";
        assert!(scan_all(talk).iter().all(|e| !e.fatal));
        let error = b"jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem while allocating on stack for %fusion.1 = f32[8,128]{1,0} fusion(), kind=kLoop\n";
        assert_eq!(scan_all(error).iter().filter(|e| e.fatal).count(), 1);
    }

    #[test]
    fn every_family_row_yields_a_json_spelling() {
        for f in Family::ALL {
            assert_eq!(
                serde_json::to_value(f).expect("json"),
                serde_json::Value::from(f.as_str())
            );
        }
        let table = super::family_table();
        assert_eq!(table.len(), super::FAMILIES.len());
        for (yields, message) in table {
            let known = Family::ALL.iter().any(|f| f.as_str() == yields)
                || WarningKind::ALL.iter().any(|k| k.as_str() == yields)
                || matches!(yields, "context" | "allocator_stats" | "(families.rs)");
            assert!(known, "{yields}: {message}");
            assert!(!message.is_empty());
        }
    }

    fn stage(text: &str) -> Option<Stage> {
        scan_all(text.as_bytes()).last().and_then(|e| e.stage)
    }

    #[test]
    fn the_deepest_user_frame_names_the_stage() {
        let err =
            "RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.";
        let tb = |frames: &str| format!("Traceback (most recent call last):\n{frames}{err}\n");
        let t = tb("  File \"t.py\", line 1, in main\n    train(cfg)\n  File \"t.py\", line 9, in train\n    metrics = evaluate(state)\n  File \"t.py\", line 30, in evaluate\n    out = eval_step(state, b)\n");
        assert_eq!(stage(&t), Some(Stage::Eval));
        let t = tb("  File \"t.py\", line 1, in main\n    state = restore_checkpoint(path)\n");
        assert_eq!(stage(&t), Some(Stage::Restore));
        // A file called generate.py is not generation; library frames say nothing.
        let t = tb("  File \"generate.py\", line 1, in main\n    run()\n  File \"/x/site-packages/jax/_src/api.py\", line 5, in generate_thing\n    f()\n");
        assert_eq!(stage(&t), None);
    }

    #[test]
    fn a_holder_denied_is_no_holder() {
        use super::holder_named;
        assert!(holder_named(
            "I checked my computer's memory usage, it's not running any other processes on the GPU"
        )
        .is_none());
        assert!(holder_named("GPU 0 is in use by another process").is_some());
        assert!(holder_named(
            "Keras doesn't free the GPU memory occupied by the old model weights"
        )
        .is_some());
    }

    #[test]
    fn progress_words_stand_alone_in_prose() {
        use super::progress_word;
        assert_eq!(
            progress_word("Saving checkpoint to out/ckpt-500"),
            Some("checkpoint")
        );
        assert_eq!(
            progress_word("***** Running Evaluation *****"),
            Some("eval")
        );
        assert_eq!(
            progress_word("INFO:tensorflow:Saving checkpoints for 22000"),
            Some("checkpoint")
        );
        for t in [
            "Model selected: {'checkpoint_info': {'filename': 'x.gguf'}}",
            "python finetune/lora.py --checkpoint_dir /llm/vicuna-7b",
            "model = train_and_evaluate(batch_size=32)",
            "helm-run --suite v1 --max-eval-instances 10",
            "Aborting and saving the final best model. Encountered exception:",
            // An issue template's environment and a config's heading.
            "- GCC/Compiler version (if compiling from source): gcc 7.5.0",
            "Cuda compilation tools, release 10.0, V10.0.130",
            "### eval",
        ] {
            assert_eq!(progress_word(t), None, "{t}");
        }
    }

    #[test]
    fn a_sentence_about_evaluation_is_the_eval_stage() {
        use super::prose_stage;
        for t in [
            "for the epochVal method. Have tried editing batch size, still no solution.",
            "it runs fine in training but OOM on validatation phase",
            "cuda out of memory will appear during the validation process",
        ] {
            assert_eq!(prose_stage(t), Some(Stage::Eval), "{t}");
        }
        for t in ["x = valid_step(model, batch)", "the value method returns"] {
            assert_eq!(prose_stage(t), None, "{t}");
        }
    }

    #[test]
    fn the_script_run_tells_what_the_run_was_doing() {
        use super::command_stage;
        for (t, want) in [
            (
                "$ python scripts/txt2img.py --prompt \"a photo\" --plms --n_samples 1",
                Some(Stage::Generation),
            ),
            (
                "CUDA_VISIBLE_DEVICES=0 python3 -u tools/train.py configs/yolox.py",
                Some(Stage::Train),
            ),
            (
                "torchrun --nproc_per_node 8 finetune_lora.py --model 7b",
                Some(Stage::Train),
            ),
            ("!python cli_demo.py", Some(Stage::Generation)),
            ("accelerate launch eval_model.py", Some(Stage::Eval)),
            ("python test.py --ckpt last.pth", None),
            ("I ran train.py and it failed", None),
            ("model = build(\"train.py\")", None),
        ] {
            assert_eq!(command_stage(t), want, "{t}");
        }
    }

    #[test]
    fn a_sentence_tells_what_the_run_was_doing() {
        use super::prose_when;
        for (t, want) in [
            (
                "I get this error when running inference on a 3090.",
                Stage::Generation,
            ),
            (
                "When trying to generate textures, the following bug comes up.",
                Stage::Generation,
            ),
            (
                "1 batch, 128 x 128, 20 steps, 8cfg, euler a.",
                Stage::Generation,
            ),
            ("单卡A100推理不了。", Stage::Generation),
            (
                "still out of memory when start training lora:",
                Stage::Train,
            ),
            ("but ran out of memory at the 170th epoch.", Stage::Train),
            (
                "the code crashes only after few training iterations",
                Stage::Train,
            ),
            (
                "CUDA OOM errors during training initialization",
                Stage::Init,
            ),
            ("The EngineCore dies at startup with:", Stage::Init),
            ("代码添加了int8量化，启动的时候还是报错", Stage::Init),
            (
                "We have a model that runs fine with pmap but fails at initialization with pjit.",
                Stage::Init,
            ),
            (
                "Mistral-7B-Instruct on n150 failed to start docker server with the error:",
                Stage::Init,
            ),
            (
                "I get this error when starting the inference server:",
                Stage::Init,
            ),
        ] {
            assert_eq!(prose_when(t), Some(want), "{t}");
        }
        for t in [
            "model = pipe(prompt, num_inference_steps=20)",
            "python train.py --epochs 10 --batch 2",
            "I trained it last year on the same card.",
        ] {
            assert_eq!(prose_when(t), None, "{t}");
        }
    }

    #[test]
    fn a_sentence_about_loading_a_model_is_the_restore_stage() {
        use super::prose_stage;
        for t in [
            "I am not able to load the Flax GPT-Neo 2.7B model in my TPU VM v3-8 instance.",
            "while loading model getting below error :",
            "my program crashes with a resource exhaustion error when I try to load the model parameters:",
            "When I try to load opt-30b the process is killed from memory exhaustion.",
            "Trying to load medium or large model, I get out of memory errors.",
            "Loading the generator crashes Python",
            "it still loads the model only in one gpu and gives me OOM.",
            "just calling torch.load on c3d.pickle raises a THCudaCheck out of memory exception for me.",
        ] {
            assert_eq!(prose_stage(t), Some(Stage::Restore), "{t}");
        }
        for t in [
            "model = load_model(path)  # then train",
            "Failed to load libtpu.so",
            "I load the data, then train the model",
            "Failed to load in-memory CUBIN: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        ] {
            assert_eq!(prose_stage(t), None, "{t}");
        }
    }

    #[test]
    fn model_sizes_from_names_and_sentences() {
        use super::model_params;
        assert_eq!(
            model_params("--model mistralai/Mistral-7B-v0.1 --dtype half"),
            Some(7_000_000_000)
        );
        assert_eq!(
            model_params("from_pretrained(\"EleutherAI/gpt-neo-2.7B\")"),
            Some(2_700_000_000)
        );
        assert_eq!(
            model_params("meta-llama/Llama-2-13b-hf"),
            Some(13_000_000_000)
        );
        assert_eq!(
            model_params("fine-tuning a 70B model on v5p"),
            Some(70_000_000_000)
        );
        assert_eq!(
            model_params("a 1.5 billion parameter model"),
            Some(1_500_000_000)
        );
        // Not model sizes: sizes in bytes, hex, versions, a lone 7b.
        assert_eq!(
            model_params("Failed to allocate request for 100.00MiB (104857600B)"),
            None
        );
        assert_eq!(
            model_params("**Params:** ~6 B (Flux-style)"),
            Some(6_000_000_000)
        );
        assert_eq!(model_params("a 6.7 B parameter model"), Some(6_700_000_000));
        assert_eq!(model_params("parameters: 13B"), Some(13_000_000_000));
        assert_eq!(
            model_params("for llama 7b on tpu v3-8,"),
            Some(7_000_000_000)
        );
        assert_eq!(
            model_params("fine-tuning Gemma 2B with LoRA"),
            Some(2_000_000_000)
        );
        assert_eq!(model_params("opt 8 bit"), None);
        assert_eq!(model_params("batch size 8 B per step"), None);
        assert_eq!(model_params("at 0x7b and jaxlib 0.4.7b"), None);
        assert_eq!(model_params("sha-256 digest v2-8 TPU"), None);
    }

    #[test]
    fn weight_precision_quantization_first() {
        use super::param_bits;
        assert_eq!(param_bits("--dtype half --max-model-len 4096"), Some(16));
        assert_eq!(param_bits("--dtype half --quantization awq"), Some(4));
        assert_eq!(
            param_bits("model = AutoModel.from_pretrained(n, load_in_8bit=True)"),
            Some(8)
        );
        assert_eq!(param_bits("params in float32"), Some(32));
        assert_eq!(param_bits("cut the batch in half"), None);
        // The quantized model's own name states its bits.
        assert_eq!(
            param_bits("--model /models/stablebeluga-13b.ggmlv3.q8_0.bin"),
            Some(8)
        );
        assert_eq!(param_bits("llama-2-70b-chat.Q4_K_M.gguf"), Some(4));
        assert_eq!(param_bits("Mixtral_11Bx2_MoE_19B-3.0bpw-h6-exl2"), Some(4));
        assert_eq!(param_bits("Llama-3-70B-4.65bpw"), Some(8));
        assert_eq!(param_bits("llama-2-13b.Q6_K.gguf"), Some(8));
        assert_eq!(param_bits("Qwen2-72B-Instruct-W4A16"), Some(4));
        assert_eq!(param_bits("--quantization fp8"), Some(8));
        assert_eq!(param_bits("seq2_0 and freq4_k"), None);
    }

    #[test]
    fn several_devices_named() {
        use super::devices_named;
        assert_eq!(devices_named("设备：A100/40G × 4"), Some(4));
        assert_eq!(devices_named("My system's running 2x 7900 xtx 24"), Some(2));
        assert_eq!(devices_named("on 8 x H100 80GB"), Some(8));
        assert_eq!(devices_named("I have 4 GPUs with 24GB each"), Some(4));
        assert_eq!(
            devices_named("vllm serve m --tensor-parallel-size 2"),
            Some(2)
        );
        assert_eq!(
            devices_named("torchrun --nproc_per_node=8 train.py"),
            Some(8)
        );
        assert_eq!(devices_named("使用两张12G显卡运行"), Some(2));
        assert_eq!(devices_named("two GPUs"), Some(2));
        assert_eq!(devices_named("on one RTX 3090"), None);
        assert_eq!(devices_named("a 3x3 conv with 512 channels"), None);
        assert_eq!(devices_named("tp=1"), None);
        assert_eq!(devices_named("batch 16 x 512 tokens"), None);
        assert_eq!(devices_named("shape 512 x 16"), None);
    }

    #[test]
    fn old_tensorflow_placement_bare_mentions_and_starved_cublas() {
        use crate::event::MemorySpace;
        // The node line under an old TF message names the op's device.
        let ev = scan_all(b"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[33600,1024]\n\t [[Node: Variable_2/Adam/Assign = Assign[T=DT_FLOAT, _device=\"/job:localhost/replica:0/task:0/device:CPU:0\"](Variable_2/Adam)]]\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].memory_space, Some(MemorySpace::Host));
        // A bare mention is decided by the error under it.
        assert!(scan_all(b" I got ResourceExhaustedError \ntensorflow.python.framework.errors_impl.ResourceExhaustedError: /data/73.tfrecords; Too many open files\n").is_empty());
        assert_eq!(
            scan_all(b"I got ResourceExhaustedError\nResourceExhaustedError: OOM when allocating tensor with shape[64,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n").len(),
            1
        );
        // cuBLAS could not create its handle: the device was already full.
        let ev = scan_all(b"E external/org_tensorflow/tensorflow/stream_executor/cuda/cuda_blas.cc:226] failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::CudaOom);
    }

    #[test]
    fn one_failure_echoed_by_every_device_is_one_event() {
        let echo = b"E pjrt_stream_executor_client.cc:2153] Execution of replica 0 failed: RESOURCE_EXHAUSTED: Failed to allocate request for 625.00MiB (655360000B) on device ordinal 7\nE pjrt_stream_executor_client.cc:2153] Execution of replica 0 failed: RESOURCE_EXHAUSTED: Failed to allocate request for 625.00MiB (655360000B) on device ordinal 1\n";
        let ev = scan_all(echo);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].repeats, 2);
        assert_eq!(
            ev[0].device.as_deref(),
            Some("device ordinal 7, device ordinal 1")
        );
        // Different requests on two devices are two failures.
        let two = b"RESOURCE_EXHAUSTED: Failed to allocate request for 625.00MiB (655360000B) on device ordinal 7\nRESOURCE_EXHAUSTED: Failed to allocate request for 1.00GiB (1073741824B) on device ordinal 1\n";
        assert_eq!(scan_all(two).len(), 2);
    }

    #[test]
    fn a_placeholder_for_a_size_that_varies() {
        let ev = scan_all(b"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate X bytes.\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::GpuOomAllocate);
        assert_eq!(ev[0].requested_bytes, None);
    }

    #[test]
    fn the_user_says_something_else_holds_the_device() {
        use super::names_tensorflow;
        assert!(!names_tensorflow(
            "third_party/tensorflow/compiler/xla/tsl/platform/env.cc:641"
        ));
        assert!(names_tensorflow(
            "  File \"/usr/lib/python3/dist-packages/tensorflow/python/client/session.py\""
        ));
        use super::gpu_named_bytes;
        let gib = |g: u64| g << 30;
        assert_eq!(
            gpu_named_bytes("Machine: 4 * Tesla P100-PCIE-16GB, memory: 256G"),
            Some(gib(16))
        );
        assert_eq!(
            gpu_named_bytes("since the GPU I'm using (A40, 48 GB VRAM) runs out"),
            Some(gib(48))
        );
        assert_eq!(
            gpu_named_bytes("Even on a machine with over 30GB of the GPU memory"),
            Some(gib(30))
        );
        assert_eq!(gpu_named_bytes("on a Colab T4"), Some(gib(16)));
        assert_eq!(gpu_named_bytes("memory: 256G, 64 CPUs"), None);
        use super::growth_said;
        assert!(growth_said(
            "Tracking the GPU memory consumption a slow and steady increase is visible."
        )
        .is_some());
        assert!(growth_said(
            "I believe there is a memory leakage on the ResNet architecture in CUDA."
        )
        .is_some());
        assert!(growth_said("it runs out of memory on epoch number 4:").is_some());
        assert!(growth_said(
            "the GPU runs out of memory from training on the task for 125 epochs."
        )
        .is_some());
        assert!(growth_said("Check for a memory leak in your loop").is_none());
        assert!(growth_said(
            "设置tp=4，持续运行时显存一直缓慢增长直到oom，以下是模型配置参数，如何排查问题？"
        )
        .is_some());
        assert!(growth_said("显存是不是一直增长？").is_none());
        assert!(growth_said("训练时没有显存泄漏").is_none());
        assert!(
            growth_said("This error happens when training several models in a for loop:").is_some()
        );
        assert!(growth_said("I compared several models on the same data").is_none());
        assert!(growth_said(
            "After each validation batch the GPU memory consumption increases until nothing in left."
        )
        .is_some());
        assert!(growth_said(
            "I found that keeping a list of the model calls was using uneccessary memory during evaluation"
        )
        .is_some());
        assert!(growth_said("The memory grows with the batch size").is_none());
        assert!(growth_said(
            "Monitoring the GPU memory I saw a constant incremental of the use of its memory"
        )
        .is_some());
        assert!(growth_said("This is not a memory leak: the batch is too large").is_none());
        assert!(growth_said("out of memory in the first epoch").is_none());
        assert!(growth_said("Epoch 1/10: loss 0.3").is_none());
        use super::holder_named;
        assert!(holder_named(
            "GPU 0 is in use by another process from 99%, so I set the other one"
        )
        .is_some());
        assert!(holder_named("some other process occupied my GPU memory").is_some());
        assert!(holder_named("Another job was running on the GPU at the time").is_some());
        assert!(holder_named("Make sure no other process uses the GPU.").is_none());
        assert!(holder_named("Is another process using the GPU?").is_none());
        assert!(holder_named("the data loader process finished").is_none());
        assert!(
            holder_named("Most of the time a GPU didn't release memory after the job is done")
                .is_some()
        );
    }

    #[test]
    fn a_quoted_phrase_in_a_sentence_names_the_message() {
        assert!(scan_all(b"The lab text says students \"should observe an 'out of memory' (OOM) error\" when calling fit.\n").is_empty());
        assert!(scan_all(b"The autotuner surfaces an opaque INTERNAL error instead of the clean RESOURCE_EXHAUSTED the narrative implies.\n").is_empty());
        assert_eq!(
            scan_all(b"I get \"RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes.\" on every run of my script\n").len(),
            1
        );
    }

    #[test]
    fn a_tf_tensor_with_its_type_but_no_device() {
        let ev = scan_all(b"ResourceExhaustedError (see above for traceback): OOM when allocating tensor of shape [1024] and type float\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].requested_bytes, Some(4096));
    }

    #[test]
    fn bfc_stats_pasted_without_their_stats_line() {
        let text = b"This resulted in ResourceExhaustedError.\n\nStats which appears in output:\nLimit:                 10198757376\nInUse:                 10029289984\nMaxInUse:              10029289984\n";
        let ev = scan_all(text);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::BfcAllocator);
        assert_eq!(
            (ev[0].limit_bytes, ev[0].used_bytes),
            (Some(10_198_757_376), Some(10_029_289_984))
        );
        // A `Limit:` line alone is not allocator statistics.
        assert!(scan_all(b"Rate Limit: 100\nResets hourly\n").is_empty());
        // Pasted from `InUse:` on, before the error it belongs to.
        let ev = scan_all(b"InUse:                      2978664704\nMaxInUse:                   3021197312\n\nW op_kernel.cc:1745] OP_REQUIRES failed at conv_ops.cc:663 : RESOURCE_EXHAUSTED: OOM when allocating tensor with shape[4,16,2160,3840] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].used_bytes, Some(2_978_664_704));
    }

    #[test]
    fn a_process_the_kernel_killed() {
        for text in [
            "Killed\n",
            "./train.sh: line 3: 81234 Killed                  python train.py\n",
            // A bash job report without its `[1]+` (the job's pid, then the command).
            "71885 Killed                  PYTHONPATH=$PYTHONPATH:. python -m kauldron.main\n",
            "zsh: killed     python train.py\n",
            "I run the script but get \"killed\" output.\n",
            "the script is killed: SIGKILL. The SIGKILL is because of out-of-memory.\n",
        ] {
            let ev = scan_all(text.as_bytes());
            assert_eq!(ev.len(), 1, "{text}");
            assert_eq!(ev[0].family, Family::HostOom, "{text}");
            assert_eq!(
                ev[0].memory_space,
                Some(crate::event::MemorySpace::Host),
                "{text}"
            );
        }
        for text in [
            "Killed the old run and restarted it.\n",
            "I killed the job with ctrl-c\n",
            "worker exited with SIGKILL\n",
        ] {
            assert!(scan_all(text.as_bytes()).is_empty(), "{text}");
        }
    }

    #[test]
    fn tpus_named_with_their_generation() {
        use super::tpu_named;
        assert_eq!(tpu_named("Used Runtime: v2-8 TPU").as_deref(), Some("v2-8"));
        assert_eq!(
            tpu_named("on a TPU VM v3-8 instance.").as_deref(),
            Some("v3-8")
        );
        assert_eq!(
            tpu_named("--accelerator-type=v5litepod-16").as_deref(),
            Some("v5litepod-16")
        );
        assert_eq!(tpu_named("tpu-v6e-8").as_deref(), Some("v6e-8"));
        assert_eq!(tpu_named("python v3 and protobuf v4"), None);
        assert_eq!(tpu_named("I am using v2.8 TPU.").as_deref(), Some("v2-8"));
        assert_eq!(tpu_named("with transformers v4.8 on GPU"), None);
    }

    #[test]
    fn a_smaller_batch_that_still_fails() {
        use super::batch_tried;
        assert!(batch_tried(
            "I tried reducing the batch size and restarting the kernel but nothing is working."
        )
        .is_some());
        assert!(batch_tried("Even with batch size 1 I get the same error").is_some());
        assert!(batch_tried("batch_size=1 still OOMs").is_some());
        assert!(batch_tried("I am not able to train even with batch size 2").is_some());
        assert!(batch_tried("I played with a batch_size, but nothing helped...").is_some());
        assert!(batch_tried(
            "with GPU I just reduced a lot of options such as batch size, feature_maps etc."
        )
        .is_some());
        assert!(
            batch_tried("if I reduced options such as the batch size, would it fit?").is_none()
        );
        // Multi-byte text just before the word: no slicing inside a character.
        assert!(
            batch_tried("我减少了很多选项，例如批次大小和其他的参数 reduced 批 batch size")
                .is_some()
        );
        assert!(
            batch_tried("I reduced the batch size down to 2 and could be able to train").is_none()
        );
        assert!(batch_tried(
            "I have reduced batch_size to 256 and img_size to 128 and error persists."
        )
        .is_none());
        // The batch was the fix, or it is only mentioned.
        assert!(batch_tried("I can make it work by reducing the batch size").is_none());
        assert!(batch_tried("I tried reducing the batch size and it worked").is_none());
        assert!(batch_tried("batch 100 loss 2.31").is_none());
    }
}

//! Message families from outside XLA's own runtime that users post with XLA programs: PyTorch's
//! CUDA caching allocator (both message generations), CUDA driver and wrapper errors (numba,
//! CuPy, `cuMemAlloc`), vLLM's KV-cache sizing errors, XLA:GPU constant allocation, and
//! accelerators outside XLA (Gaudi, Tenstorrent) read best-effort. One function per family; each
//! fills every figure its message states and nothing it does not.

use crate::event::{Backend, Event, Family, Framework, MemorySpace, Phase};
use crate::parse::{new_event, Piece};
use crate::size::parse_size;
use regex::Regex;
use std::sync::OnceLock;

struct Patterns {
    torch_new: Regex,
    torch_allowed: Regex,
    torch_old: Regex,
    torch_async: Regex,
    torch_old_cut: Regex,
    cpu_allocator: Regex,
    paddle: Regex,
    pinned: Regex,
    mps: Regex,
    win_paging: Regex,
    miopen: Regex,
    numpy_host: Regex,
    catboost: Regex,
    ggml_buffer: Regex,
    ggml_pool: Regex,
    tvm_storage: Regex,
    vulkan: Regex,
    cpu_enforce: Regex,
    tgi_prefill: Regex,
    figures_told: Regex,
    mlx: Regex,
    mlc_insufficient: Regex,
    trt_scratch: Regex,
    xla_collective: Regex,
    metal_buffer: Regex,
    sophgo: Regex,
    rknn: Regex,
    spark_device_store: Regex,
    dali_alloc: Regex,
    vllm_startup_free: Regex,
    habana_workspace: Regex,
    nki_bound: Regex,
    tcmalloc_nil: Regex,
    not_enough_enum: Regex,
    dst_tensor: Regex,
    neuron_sb: Regex,
    neuron_device: Regex,
    poplar_stream: Regex,
    xpu_block: Regex,
    directml: Regex,
    python_memory_error: Regex,
    torch_notebook: Regex,
    ort_arena: Regex,
    iree_hip: Regex,
    openvino_cap: Regex,
    openvino_gpu: Regex,
    rmm_initial: Regex,
    catboost_ctrs: Regex,
    coreml: Regex,
    nvmap: Regex,
    opencl_alloc: Regex,
    warp_array: Regex,
    mindspore_total: Regex,
    llm_engine_vram: Regex,
    metal_command_buffer: Regex,
    ray_node: Regex,
    k8s_evicted: Regex,
    cpp_bad_alloc: Regex,
    torch_process: Regex,
    torch_this_process: Regex,
    torch_unallocated: Regex,
    cuda_driver: Regex,
    cupy: Regex,
    vllm_cache: Regex,
    sglang_pool: Regex,
    ggml_alloc: Regex,
    vllm_negative: Regex,
    vllm_needed: Regex,
    llvm_jit: Regex,
    vllm_max_len: Regex,
    constant: Regex,
    gaudi: Regex,
    tenstorrent: Regex,
    gpu_shared: Regex,
    gpu_shared_runtime: Regex,
    ptxas_shared: Regex,
}

fn re(s: &str) -> Regex {
    Regex::new(s).expect("family pattern")
}

fn p() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    const SZ: &str = r"(\d[\d.,]*\s*(?:[KMGTP]i?B|bytes|B))";
    P.get_or_init(|| Patterns {
        // torch >= 2.1: "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total
        // capacity of 14.75 GiB of which 3.06 MiB is free."
        // Users retype and re-wrap it: any case, spaces dropped or doubled, a line break for a
        // space, the typo `capacty` (torch 2.1), the period after the request lost, a word
        // doubled by a screenshot's text recognition (`of whi ich`), the text cut after the free
        // figure (`of which 402.38 MiB` and no more).
        // The cap a per-process memory fraction sets, in the message's middle.
        torch_allowed: re(&format!(r"is free\.\s+(?:[^.;]{{0,200}}\.\s+)?{SZ}\s+allowed;")),
        torch_new: re(&format!(
            r"(?i)(?:CUDA|XPU|MPS|HIP)\s+out\s+of\s+memory\s*[.,]?\s*Tried\s+to\s+allocate\s*{SZ}\s*[.,]?\s*(?:GPU|Device)\s*(\d*)\s+has\s+a\s+total\s*capac?i?ty\s+of\s*{SZ}\s*of\s+wh(?:ich|[a-z]{{1,3}}\s+[a-z]{{0,3}}ich)\s*{SZ}(?:\s*is\s+free\b|[ \t]*(?m:$))"
        )),
        // older: "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total
        // capacity; 12.23 GiB already allocated; 1.43 GiB free; 13.23 GiB reserved in total by
        // PyTorch)"; retyped as `cuda out of memory, tried to allocate 50MiB(GPU 0; 1.96GiB
        // totalcapacity;1.33GiB ...` or re-wrapped without the parentheses; or pasted from its
        // `Tried to allocate` on (the headline's first words left out).
        torch_old: re(&format!(
            r"(?i)(?:(?:CUDA|HIP|XPU|NPU)\s+out\s+of\s+memory\s*[.,]?\s*)?Tried\s+to\s+allocate\s*{SZ}\s*\(?\s*(?:GPU|NPU)\s*(\d+)\s*;\s*{SZ}\s*total\s*capacity\s*;\s*{SZ}\s*already\s*allocated\s*;(?:\s*\d[\d.,]*\s*[KMGTP]i?B\s*current\s*active\s*;)?\s*{SZ}\s*free\s*;\s*(?:{SZ}\s*cached|{SZ}\s*reserved\s+in\s+total(?:\s+by\s*PyTorch)?)"
        )),
        // The older message cut after its capacity (`CUDA out of memory. Tried to allocate 28.27
        // GiB (GPU 0; 15.77 GiB total capacity; 47.02 MiB already allocated;` and no more), or
        // retyped in a title without its request (`CUDA out of memory.(GPU 1; 14.76 GiB total
        // capacity;)`): what it states.
        torch_old_cut: re(&format!(
            r"(?i)(?:CUDA|HIP|XPU)\s+out\s+of\s+memory\s*[.,]?\s*(?:Tried\s+to\s+allocate\s*{SZ}\s*)?\(?\s*GPU\s*(\d+)\s*;\s*{SZ}\s*total\s*capacity(?:\s*;\s*{SZ}\s*already\s*allocated)?"
        )),
        // PyTorch on the host: `DefaultCPUAllocator: can't allocate memory: you tried to allocate
        // 64597662208 bytes. Error code 12 (Cannot allocate memory)`; quoted without its figure
        // (`RuntimeError: [enforce fail at CPUAllocator.cpp:67] . DefaultCPUAllocator: can't
        // allocate memory`, the cleaner having taken the bracket for a log prefix).
        cpu_allocator: re(r"CPUAllocator: (?:can't allocate memory|not enough memory)(?::? you tried to allocate (\d+) bytes)?"),
        // PyTorch's cudaMallocAsync backend (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`,
        // ComfyUI's default): `Allocation on device 0 would exceed allowed memory. (out of
        // memory)`, then one figure per line (`Currently allocated     : 21.55 GiB`,
        // `Requested : ...`, `Device limit : ...`, `Free (according to CUDA): ...`, `PyTorch
        // limit (set by user-supplied memory fraction)` and its value on the next line). The
        // headline may be cut after `Allocation on device`, as in ComfyUI's error report
        // (`**Exception Type:** torch.OutOfMemoryError - **Exception Message:** Allocation on
        // device`).
        torch_async: re(
            r"Allocation\s+on\s+device\s*(\d*)\s+would\s+exceed\s+allowed\s+memory|OutOfMemoryError:\s*Allocation\s+on\s+device\b|OutOfMemoryError\W{1,12}Exception\s+Message:\W{0,4}Allocation\s+on\s+device\b",
        ),
        // PaddlePaddle's allocator: `Out of memory error on GPU 0. Cannot allocate 18.062744MB
        // memory on GPU 0, available memory is only 17.537501MB.`; newer releases name what is
        // allocated: `..., 1.204346GB memory has been allocated and available memory is only ...`.
        paddle: re(&format!(
            r"Out of memory error on GPU (\d+)\.\s*Cannot allocate\s*{SZ}\s*memory on GPU \d+,\s*(?:{SZ}\s*memory has been allocated and\s*)?available memory is only\s*{SZ}"
        )),
        // llama.cpp's page-locked host buffer: `WARNING: failed to allocate 82120.00 MB of
        // pinned memory: out of memory` (host memory, the KV cache or weights kept on the host).
        pinned: re(&format!(r"failed to allocate\s+{SZ}\s+of pinned memory:\s*out of memory")),
        // NumPy's host allocation: `MemoryError: Unable to allocate 315. GiB for an array with
        // shape (10000, 100, 84480) and data type float32`.
        // Before NumPy 1.17 the size was not printed: `MemoryError: Unable to allocate array
        // with shape (10197629, 50, 238) and data type bool` (the shape and type give it).
        numpy_host: re(r"Unable to allocate\s+(?:(\d+(?:\.\d*)?)\s*([KMGTP]i?B)\s+for an array with shape|array with shape \(([\d,\s]+)\) and data type (\w+))"),
        // CatBoost's GPU pool: `(NCudaLib::TOutOfMemoryError) ...: Error: Out of memory.
        // Requested 1070.546387; Free 1010.952393` (megabytes, unit unprinted).
        catboost: re(r"Out of memory\. Requested ([\d.]+); Free ([\d.]+)"),
        // llama.cpp / stable-diffusion.cpp (ggml), sizes in bare bytes: a backend buffer
        // (`ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size N`,
        // `ggml_vulkan: Device memory allocation of size N failed.`), and 2023's fixed context
        // pool (`not enough space in the context's memory pool (needed N, available M)`).
        ggml_buffer: re(r"(?:ggml_backend_(\w+?)_buffer_type_alloc_buffer: failed to allocate buffer of size|ggml_(\w+): Device memory allocation of size) (\d+)"),
        ggml_pool: re(r"not enough space in the context's memory pool \(needed (\d+), available (\d+)\)"),
        // TVM's (MLC LLM's) statically planned storage: `storage allocation failure, attempted to
        // allocate N at offset 0 in region that is Mbytes`.
        tvm_storage: re(r"storage allocation failure, attempted to allocate (\d+) at offset \d+ in region that is (\d+)\s*bytes"),
        // Vulkan (ncnn, ggml): `vkAllocateMemory failed -1`, `ErrorOutOfDeviceMemory`.
        vulkan: re(r"vkAllocateMemory failed|ErrorOutOfDeviceMemory|VK_ERROR_OUT_OF_DEVICE_MEMORY"),
        // text-generation-inference's warm-up: `Not enough memory to handle 4096 prefill tokens.
        // You need to decrease --max-batch-prefill-tokens` (the KV cache and the prefill batch).
        tgi_prefill: re(r"Not enough memory to handle (\d+) prefill tokens"),
        // PyTorch's host allocator named by its source file alone (`enforce fail at
        // CPUAllocator.cpp`, the message's first words, as users quote it).
        cpu_enforce: re(r"enforce fail at (?:\w+[/\\])*CPUAllocator\.cpp"),
        // Figures a wrapper prints under a CUDA out-of-memory (XGBoost's `- Free memory:
        // 53.1098GB\n- Requested memory: 64GB`, TensorRT's `Requested amount of GPU memory
        // (15485030400 bytes)`, Faiss's `failed to cudaMalloc 47064032 bytes` and its
        // resources' `alloc fail type TemporaryMemoryOverflow dev 0 space Device stream 0x...
        // size 32279537664 bytes (cudaMalloc error out of memory [2])`).
        figures_told: re(&format!(
            r"(?:Free memory:\s*{SZ})|(?:Requested memory:\s*{SZ})|(?:Requested amount of GPU memory \((\d+) bytes\))|(?:cudaMalloc\s+(\d+)\s+bytes)|(?:failed\s+to\s+alloc\s+(\d+)\s+bytes)|(?:Requested size was (\d+) bytes)|(?:alloc fail type \w+ dev \d+ space \w+ stream \S+ size (\d+) bytes)"
        )),
        // Apple's MLX: `[malloc_or_wait] Unable to allocate 12 bytes.`, `[metal::malloc]
        // Attempting to allocate N bytes which is greater than the maximum allowed buffer size
        // of M bytes.`, `[metal::malloc] Resource limit (499000) exceeded.` (a count of live
        // buffers, not bytes: no figure).
        mlx: re(
            r"\[(?:malloc_or_wait|metal::malloc)\]\s*(?:Unable to allocate (\d+) bytes|Attempting to allocate (\d+) bytes which is greater than the maximum allowed buffer size of (\d+) bytes|Resource limit \(\d+\) exceeded)",
        ),
        // MLC LLM's memory plan: `Insufficient GPU memory error: The available single GPU memory
        // is 20584.716 MB, which is less than the sum of model weight size (5977.188 MB) and
        // temporary buffer size (15013.765 MB).` (the KV cache comes after both).
        // TensorRT's builder (TensorRT-LLM's plugins): `plugin node ... requires 210571452800
        // bytes of scratch space, but only 47697362944 is available. Try increasing the workspace
        // size with IBuilderConfig::setMemoryPoolLimit().`
        trt_scratch: re(r"requires (\d+) bytes of scratch space, but only (\d+) is available"),
        // XLA:GPU's stream executor allocator refusing a collective's buffer (NCCL's `Cuda
        // failure 2 'out of memory'` printed beside it): `could not allocate collective of size:
        // 20289079296`.
        xla_collective: re(r"could not allocate collective of size:\s*(\d+)"),
        mlc_insufficient: re(&format!(
            r"Insufficient GPU memory error:\s*The available single GPU memory is\s*{SZ},\s*which is less than the sum of model weight size\s*\({SZ}\)\s*and temporary buffer size\s*\({SZ}\)"
        )),
        // Metal's per-buffer cap (a debug device's validation): `newBufferWith*:length 0x86004000
        // must not exceed 2048 MB.`
        metal_buffer: re(r"newBufferWith\S*:length\s+(0x[0-9a-fA-F]+|\d+)\s+must not exceed\s+(\d+)\s*MB"),
        // Sophgo's device memory (bmlib): `bm_alloc_gmem failed, dev_id = 0, size = 0xc0fb4000`.
        sophgo: re(r"bm_alloc_gmem failed(?:,\s*dev_id\s*=\s*(\d+))?(?:,\s*size\s*=\s*(0x[0-9a-fA-F]+|\d+))?"),
        // Rockchip's NPU runtime (RKNN, RKLLM): `E RKNN: [01:13:18.656] failed to malloc npu
        // memory, size: 1427746880, flags: 0x2` (`memory!,` on Android).
        rknn: re(r"failed to malloc npu memory!?,\s*size:\s*(\d+)"),
        // Spark RAPIDS' spill handler with nothing left to spill: `Device allocation of
        // 345571976 bytes failed, device store has 0 bytes. Total RMM allocated is 9319438848
        // bytes.`
        spark_device_store: re(r"Device allocation of (\d+) bytes failed, device store has (\d+) bytes\.(?:\s*Total RMM allocated is (\d+) bytes)?"),
        // NVIDIA DALI's device buffers: `Can't allocate 129499136 bytes on device 0.`, and its bare
        // `CUDA allocation failed` on a line of its own.
        dali_alloc: re(r"Can't allocate (\d+) bytes on device (\d+)|^\s*CUDA allocation failed\s*$"),
        // vLLM V1's start-up check: `Free memory on device (67.24/79.25 GiB) on startup is less
        // than desired GPU memory utilization (0.9, 71.33 GiB).`
        vllm_startup_free: re(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization \(([\d.]+), ([\d.]+) GiB\)"),
        // Habana Gaudi's graph workspace: `FATAL ERROR :: MODULE:SYNHELPER workspace Allocation
        // of size ::14493510400 failed!`.
        habana_workspace: re(r"workspace Allocation of size\s*::\s*(\d+)\s+failed"),
        // AWS Neuron's NKI compiler, a tile placed past the on-chip state buffer (SBUF):
        // `Allocated memory out of bound {b_tile_sub0}@SB<0,400000>(128x4000)`.
        nki_bound: re(r"Allocated memory out of bound \{[^}]*\}@SB<"),
        // tcmalloc's failed large allocation (host): `tcmalloc: large alloc N bytes == (nil) @ ...`
        // (`== 0x7f...` is an allocation that succeeded, only logged).
        tcmalloc_nil: re(r"large alloc (\d+) bytes == \(nil\)"),
        // A Rust server's error enum (text-generation-inference's backends):
        // `Backend(NotEnoughMemory(64))`.
        not_enough_enum: re(r"\bNotEnoughMemory\(\d*\)"),
        // TensorFlow copying a tensor to a GPU with no memory left for it: `InternalError: Dst
        // tensor is not initialized.` (no memory word; TF's documented symptom of a full GPU).
        dst_tensor: re(r"Dst tensor is not initialized"),
        // AWS Neuron's compiler: an instruction whose operands do not fit the on-chip state
        // buffer (`[GCA035]  Instruction: I-21-0 with opcode: TensorTensor couldn't be allocated
        // in SB`), its figures a few lines below (`read_neuron_sb`).
        neuron_sb: re(r"couldn't be allocated in SB"),
        // AWS Neuron's runtime: `Failed to alloc DEVICE memory: 180355072`, the core's
        // utilization listed under it (`* total: 15.855GB`).
        neuron_device: re(&format!(
            r"Failed to alloc DEVICE memory:\s*(\d+)(?:[\s\S]{{0,1200}}?\*\s*total:\s*{SZ})?"
        )),
        // Graphcore's Poplar: `Out of memory. Single stream of length 149766584 in bufferIndex 1`
        // (a host-device data stream, sized when the graph is compiled).
        poplar_stream: re(r"Out of memory\. Single stream of length (\d+)"),
        // Intel's extension for PyTorch (XPU): one block may not exceed 4 GB, `Current platform
        // can NOT allocate memory block with size larger than 4GB! Tried to allocate 7.62 GiB
        // (GPU  0; 15.11 GiB total capacity; 334.79 MiB already allocated; 474.00 MiB reserved
        // in total by PyTorch)`.
        xpu_block: re(&format!(
            r"can NOT allocate memory block with size larger than (\d+)GB!\s*Tried to allocate\s*{SZ}(?:\s*\(GPU\s*(\d+);\s*{SZ}\s*total capacity;\s*{SZ}\s*already allocated)?"
        )),
        // DirectML (torch-directml): `Could not allocate tensor with 81544192 bytes. There is
        // not enough GPU video memory available!`
        directml: re(r"Could not allocate tensor with (\d+) bytes\.\s*There is not enough GPU video memory"),
        // Python's own exception, bare or with the C++ allocator's word alone (`MemoryError`,
        // `MemoryError: std::bad_alloc`; RMM's device pool says more after it): the host's.
        python_memory_error: re(r"^\s*MemoryError\s*(?::\s*(?:std::bad_alloc)?\s*)?$"),
        // PyTorch's exception class heading a notebook's traceback (`OutOfMemoryError
        // Traceback (most recent call last)`), its message below cut or not pasted.
        torch_notebook: re(r"^\s*(?:torch\.(?:cuda\.)?)?OutOfMemoryError\s+Traceback\s+\(most\s+recent\s+call\s+last\)"),
        // ONNX Runtime's arena (CUDA or CPU execution provider): `BFCArena::AllocateRawInternal
        // Failed to allocate memory for requested buffer of size 939524096`.
        ort_arena: re(r"Failed to allocate memory for requested buffer of size (\d+)"),
        // IREE on ROCm: `RESOURCE_EXHAUSTED; HIP driver error 'hipErrorOutOfMemory' (2): out of
        // memory; failed to allocate buffer of length 34638106880`.
        iree_hip: re(r"HIP driver error 'hipErrorOutOfMemory'(?:[^\n]{0,120}?failed to allocate buffer of length (\d+))?"),
        // OpenVINO's GPU plugin: one memory object above the device's cap (`[GPU] Exceeded max
        // size of memory object allocation: requested N bytes, but max alloc size supported by
        // device is M bytes`), or `[GPU] out of GPU resources`.
        openvino_cap: re(r"Exceeded max size of memory object allocation: requested (\d+) bytes, but max alloc size supported by device is (\d+) bytes"),
        openvino_gpu: re(r"\[GPU\] out of GPU resources"),
        // Spark RAPIDS: `Initial RMM allocation (14652.787109375 MB) is larger than free memory
        // (13986.875 MB)`.
        rmm_initial: re(r"Initial RMM allocation \(([\d.]+) MB\) is larger than free memory \(([\d.]+) MB\)"),
        // CatBoost's GPU tree counters: `not enough memory for tree-ctrs: 2666.668652 available,
        // need at least 4902.937321` (megabytes, unit unprinted).
        catboost_ctrs: re(r"not enough memory for tree-ctrs: ([\d.]+) available, need at least ([\d.]+)"),
        // Core ML's Espresso on iOS/macOS: `Memory allocation error 12: 1448370000 bytes`.
        coreml: re(r"Memory allocation error 12: (\d+) bytes"),
        // Jetson's unified memory: `NvMapMemAllocInternalTagged: 1075072515 error 12` (ENOMEM;
        // the first number is a tag, not a size).
        nvmap: re(r"NvMapMemAlloc\w*: \d+ error 12\b"),
        // OpenCL (LightGBM's GPU learner, boost::compute): `Memory Object Allocation Failure`.
        opencl_alloc: re(r"Memory Object Allocation Failure"),
        // NVIDIA Warp (Isaac Lab's simulation arrays): `RuntimeError: Array allocation failed on
        // device: cuda:0 for 16777216 bytes`.
        warp_array: re(r"Array allocation failed on device: (\S+) for (\d+) bytes"),
        // MindSpore's dynamic allocator (Ascend NPUs): `TotalUsedMemStatistics : 29356337664 plus
        // TotalUsedByEventMemStatistics : 0 and plus alloc size : 301990400 is more than total
        // mem size : 29464985600.` (bytes; no out-of-memory word).
        mindspore_total: re(r"TotalUsedMemStatistics\s*:\s*(\d+)\s+plus\s+TotalUsedByEventMemStatistics\s*:\s*(\d+)\s+and\s+plus\s+alloc\s+size\s*:\s*(\d+)\s+is\s+more\s+than\s+total\s+mem\s+size\s*:\s*(\d+)"),
        // LLM engines refusing to start for the device's memory: ExLlamaV2's autosplit
        // (`RuntimeError: Insufficient VRAM for model and cache`), TensorRT-LLM's executor
        // (`Executor creation failed due to insufficient GPU memory.`, its figures in the lines
        // under it: `read_trtllm_executor`).
        llm_engine_vram: re(r"Insufficient VRAM for model and cache|Executor creation failed due to insufficient GPU memory"),
        // Metal running a command buffer without memory (MLX): `[METAL] Command buffer
        // execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)`.
        metal_command_buffer: re(r"kIOGPUCommandBufferCallbackErrorOutOfMemory"),
        // Ray's memory monitor: `ray.exceptions.OutOfMemoryError: Task was killed due to the node
        // running low on memory. Memory on the node (IP: ...) where the task was running was
        // 59.49GB / 62.58GB (0.950744)`: the node's host memory.
        ray_node: re(&format!(r"killed due to the node running low on memory(?:[\s\S]{{0,300}}?was\s+{SZ}\s*/\s*{SZ})?")),
        // Kubernetes evicting a pod: `The node was low on resource: memory.`
        k8s_evicted: re(r"The node was low on resource: memory"),
        // A C++ program's allocation failure, uncaught: `terminate called after throwing an
        // instance of 'std::bad_alloc'` (the host's memory).
        cpp_bad_alloc: re(r"terminate called after throwing an instance of 'std::bad_alloc'"),
        // PyTorch on Apple silicon: `MPS backend out of memory (MPS allocated: 8.93 GB, other
        // allocations: 120.39 MB, max allowed: 9.07 GB). Tried to allocate 25.00 MB on private
        // pool.` (the limit is the high watermark, PYTORCH_MPS_HIGH_WATERMARK_RATIO of the unified
        // memory); the headline alone too.
        mps: re(&format!(
            r"MPS backend out of memory(?:\s*\(MPS allocated:\s*{SZ},\s*other allocations:\s*{SZ},\s*max allowed:\s*{SZ}\)\.?(?:\s*Tried to allocate\s*{SZ})?)?"
        )),
        // Windows' commit limit: `OSError: [WinError 1455] The paging file is too small for this
        // operation to complete.` (host memory: DataLoader workers each loading torch's DLLs).
        win_paging: re(r"\[WinError 1455\]"),
        // ROCm's MIOpen: `MIOpen Error: .../handlehip.cpp:68: Memory not available to allocate
        // buffer: 528515072`.
        miopen: re(r"Memory not available to allocate buffer:\s*(\d+)"),
        torch_process: re(&format!(
            r"(?:Process\s+\d+\s+has|this\s+process\s+has)\s+{SZ}\s+memory\s+in\s+use"
        )),
        // torch >= 2.2 names its own process apart from the others it lists (`Process 644 has
        // 48.01 GiB memory in use. Including non-PyTorch memory, this process has 30.26 GiB`).
        torch_this_process: re(&format!(r"this\s+process\s+has\s+{SZ}\s+memory\s+in\s+use")),
        torch_unallocated: re(&format!(
            r"Of\s+the\s+allocated\s+memory\s+{SZ}\s+is\s+allocated\s+by\s+PyTorch,\s+and\s+{SZ}\s+is\s+reserved\s+by\s+PyTorch\s+but\s+unallocated"
        )),
        // The CUDA runtime's "out of memory" as C programs print it: `CUDA error: out of memory`
        // (PyTorch), `CUDA Error: out of memory` (darknet), `cuda runtime error (2) : out of
        // memory` (old PyTorch), `out of memory cudaMalloc(&p, n)` / `cudaMalloc failed: out of
        // memory` (hand-written CUDA checks that print the call); llama.cpp's `CUDA error 2 at
        // ggml-cuda.cu:7641: out of memory`, TensorRT-LLM's `CUDA runtime error in
        // ::cudaMallocAsync(...): out of memory`.
        // Caffe's `Cannot create Cublas handle. Cublas won't be available.` is the same cuBLAS
        // failure as the one below.
        // `failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED`: cuBLAS found no
        // memory for its handle, the device already taken (a preallocating framework or another
        // process); the fix users report is a smaller pool or allow_growth. PyTorch's
        // `CUBLAS_STATUS_NOT_INITIALIZED when calling cublasCreate(handle)` is the same.
        // TensorRT: `Cuda Error in nvinfer1::internal::DefaultAllocator::allocate: 2 (out of
        // memory)`, and (8.x) `Error Code 2: OutOfMemory (Requested size was N bytes.)`; dlib's
        // `Error while calling cudaMallocHost(...) in file gpu_data.cpp:181. code: 2, reason: out
        // of memory`; Faiss's `Faiss assertion err == cudaSuccess failed in char*
        // faiss::gpu::StackDeviceMemory::Stack::getAlloc` (its temporary memory's cudaMalloc).
        cuda_driver: re(
            r"(?i:CUDA\s+(?:runtime\s+)?error(?:\s*\(2\))?\s*:\s*out\s+of\s+memory)|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|Cuda Error in [\w:]+: 2 \(out of memory\)|Error while calling \w+[^\n]{0,240}?code: 2, reason: out of memory|Error Code \d+: OutOfMemory|Cuda Runtime \(out of memory\)|RMM failure at[^\n]{0,240}?(?:Maximum pool size exceeded|out of memory)|Runtime error: out of memory [^\s]+\.(?:hpp|cpp|cu|h):\d+|CUDA\s+(?:runtime\s+)?error(?:\s+2\s+at|\s+in)\s[^\n]{0,240}?:\s*out of memory|THCudaCheck FAIL[^\n]{0,200}?error=2\s*:\s*out of memory|CUBLAS_STATUS_ALLOC_FAILED|failed to create cublas handle: CUBLAS_STATUS_NOT_INITIALIZED|CUBLAS_STATUS_NOT_INITIALIZED when calling `?cublasCreate|Failed to determine best cudnn convolution algorithm|Failed to get convolution algorithm\. This is probably because cuDNN failed to initialize|cuSolver has not been initialized|GetBlasGemmAlgorithms|(?i:cannot|could\s+not|couldn't|unable\s+to)\s+create\s+(?i:cublas)\s+handle|cuMemAlloc[A-Za-z_]* (?:failed|results in)|(?i:CUDA failed with error out of memory)|out of memory\s+cudaMalloc|cudaMalloc[A-Za-z_]*\b[^\n]{0,160}?(?:failed|error)[^\n]{0,40}?out of memory|(?:cudaLaunch|cudaMemcpy\w*|cudaFree|cudaDeviceSynchronize|cudaFuncSetAttribute)\b[^\n]{0,120}?:\s*out of memory|Faiss assertion '?err == cudaSuccess'? failed in [^\n]{0,160}?::(?:getAlloc|allocMemory)\b",
        ),
        // CuPy: "Out of memory allocating 1,073,741,824 bytes (allocated so far: 3,221,225,472 bytes)."
        // CuPy before v6: "out of memory to allocate 1073741824 bytes (total 12373894656 bytes)"
        // (the pool's total, not read as a figure).
        // With a pool limit set (`mempool.set_limit`): "... (allocated so far: 536,870,912 bytes,
        // limit set to: 1,073,741,824 bytes)."
        cupy: re(r"[Oo]ut of memory (?:allocating|to allocate) ([\d,]+) bytes \((?:allocated so far: ([\d,]+) bytes(?:, limit set to: ([\d,]+) bytes)?\)|total [\d,]+ bytes\))"),
        vllm_cache: re(r"No available memory for the cache blocks"),
        // SGLang's scheduler, its KV pool counted in tokens: `Decode out of memory. Try to lower
        // your batch size.` (the figures that follow are tokens, not bytes).
        sglang_pool: re(r"(?:Decode|Prefill|Extend)\s+out\s+of\s+memory\.\s*Try\s+to\s+lower\s+your\s+batch\s+size"),
        // ggml's CUDA backend names its request before the CUDA error: `allocating 4514.05 MiB
        // on device 0: cudaMalloc failed: out of memory`.
        ggml_alloc: re(&format!(r"allocating\s+{SZ}\s+on\s+device\s+\d+:\s*cudaMalloc")),
        // vLLM's memory profile leaving the KV cache a negative budget, which fails the engine
        // (no cache block fits): V0 "the rest of the memory reserved for KV Cache is -1.05GiB.",
        // V1 "Available KV cache memory: -1.05 GiB".
        vllm_negative: re(r"(?i:reserved\s+for\s+KV\s+Cache\s+is|Available\s+KV\s+cache\s+memory:)\s*-\s*\d"),
        // vLLM v1 (and tpu-inference): "(16.00 GiB KV cache is needed, which is larger than the
        // available KV cache memory (0.71 GiB)".
        vllm_needed: re(&format!(
            r"{SZ} KV cache is needed, which is larger than the available KV cache memory \({SZ}\)"
        )),
        // LLVM's JIT could not map newly compiled code (XLA:CPU, and host code of XLA:GPU):
        // host memory, usually filled by executables compiled for ever new shapes.
        llvm_jit: re(r"JIT session error: Cannot allocate memory"),
        vllm_max_len: re(
            r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)",
        ),
        // XLA:GPU: "Failed to allocate 1234 bytes for new constant"
        constant: re(r"Failed to allocate (\d+) bytes for new constant"),
        // Gaudi: "DEVMEM allocation failed", "MODULE:PT_DEVMEM Allocation failed for size::3288334336
        // (3136)MB", "synStatus=26 [Device memory allocation failed]".
        gaudi: re(r"(?i:DEVMEM allocation failed)(?: for size::(\d+))?|Device memory allocation failed|synStatus.*(?:26|OutOfDeviceMemory)"),
        // Tenstorrent: "Out of Memory: Not enough space to allocate 2147483648 B DRAM buffer
        // across 12 banks, where each bank needs to store 178956800 B"
        // ... "but bank size is 1071821792 B (allocated: 784847680 B, free: 286974112 B,
        // largest free block: 216504544 B)": the tail, when printed, is per bank.
        // A GPU kernel's per-block shared memory (Pallas on GPU, Triton): "Shared memory size
        // limit exceeded: requested 4194304, available: 101376" (users paste it wrapped).
        // Triton itself (and Inductor's autotuning): `out of resource: shared memory, Required:
        // 163840, Hardware limit: 101376` (`Hardware limitation:` in older Triton).
        gpu_shared: re(r"Shared memory size limit exceeded:\s*requested (\d+),\s*available:\s*(\d+)|out of resource: shared memory,\s*Required:\s*(\d+),?\s*Hardware limit(?:ation)?:\s*(\d+)"),
        // A kernel launched with more shared memory than the GPU has (a Triton / Pallas kernel
        // in a custom call): `INTERNAL: Shared memory requested exceeds device resources.`
        gpu_shared_runtime: re(r"Shared memory requested exceeds device resources"),
        // ptxas on an XLA:GPU fusion: "Entry function 'fusion_42' uses too much shared data
        // (0xc600 bytes, 0xc000 max)" (the max is sometimes cut by the log's line).
        ptxas_shared: re(r"Entry function '([^']+)' uses too much shared data \((0x[0-9a-fA-F]+|\d+) bytes,?\s*(?:(0x[0-9a-fA-F]+|\d+) max)?"),
        // Users paste it hard-wrapped: a space may be a line break.
        tenstorrent: re(&format!(
            r"Out of Memory: Not enough space to allocate {SZ} (DRAM|L1) buffer(?: across (\d+) banks, where each bank needs to store {SZ}(?:, but bank size is (?:only )?{SZ}(?: \(allocated: {SZ}, free: {SZ}, largest free block: {SZ}\))?)?)?"
        ).replace(' ', r"\s+")),
    })
}

/// The bytes of a NumPy array of `shape` (`10197629, 50, 238`) and `dtype` (`bool`, `float32`),
/// for the types whose width NumPy's name states (`None` for the others).
fn numpy_bytes(shape: &str, dtype: &str) -> Option<u64> {
    let width = match dtype {
        "bool" | "int8" | "uint8" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "int64" | "uint64" | "float64" | "complex64" => 8,
        "complex128" => 16,
        _ => return None,
    };
    shape
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .try_fold(width, |n: u64, d| n.checked_mul(d.parse().ok()?))
}

fn bytes(c: &regex::Captures<'_>, i: usize) -> Option<u64> {
    let s = c.get(i)?.as_str().replace(',', "");
    parse_size(&s).or_else(|| s.trim().parse().ok())
}

/// A size printed in bytes, in decimal or hexadecimal (`0xc0fb4000`).
fn dec_or_hex(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// TensorRT-LLM's executor report under its headline: `Total GPU memory (GiB): 140.06` (the
/// device) and `Free GPU memory before component creation attempt (GiB): 108.86`.
pub(crate) fn read_trtllm_executor(e: &mut Event, t: &str) {
    // The unit is only in the label: `(GiB)`.
    let gib = |v: &str| {
        let n: f64 = v.trim().parse().ok()?;
        let unit = crate::size::unit_bytes("GiB")? as f64;
        Some((n * unit).round() as u64)
    };
    if let Some(v) = t.strip_prefix("Total GPU memory (GiB):") {
        e.limit_bytes = e.limit_bytes.or_else(|| gib(v));
    } else if let Some(v) =
        t.strip_prefix("Free GPU memory before component creation attempt (GiB):")
    {
        e.free_bytes = e.free_bytes.or_else(|| gib(v));
    }
}

fn host_event(line: u64, flat: &str) -> Event {
    let mut e = new_event(line, Family::HostOom, Phase::Runtime, flat);
    e.memory_space = Some(MemorySpace::Host);
    e
}

fn gpu_event(line: u64, family: Family, flat: &str) -> Event {
    let mut e = new_event(line, family, Phase::Runtime, flat);
    e.backend = Some(Backend::Gpu);
    e.memory_space = Some(MemorySpace::Device);
    e
}

/// The families of this module, tried on `flat` (a line and the three after it); `first` is the
/// length of its first line. `None` when none matches on the first line.
pub(crate) fn headline(flat: &str, first: usize, line: u64) -> Option<(Piece, usize)> {
    let pat = p();
    let on_first = |m: &regex::Match<'_>| m.start() <= first;
    // A pattern's captures when its match starts on the first line.
    let at_head = |re: &Regex| {
        re.captures(flat)
            .filter(|c| c.get(0).is_some_and(|m| on_first(&m)))
    };
    if let Some(c) = at_head(&pat.mlx) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("mlx".into());
        e.requested_bytes = c.get(1).or(c.get(2)).and_then(|m| m.as_str().parse().ok());
        e.limit_bytes = c.get(3).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.xla_collective) {
        let mut e = gpu_event(line, Family::CudaOom, flat);
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.trt_scratch) {
        // The engine is being built: the builder's workspace (its memory pool limit) is short.
        let mut e = gpu_event(line, Family::CudaOom, flat);
        e.phase = Phase::Compile;
        e.requested_bytes = c[1].parse().ok();
        e.free_bytes = c[2].parse().ok();
        e.pool_setting = Some("IBuilderConfig::setMemoryPoolLimit".into());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.mlc_insufficient) {
        let mut e = gpu_event(line, Family::VllmKvCache, flat);
        e.free_bytes = bytes(&c, 1);
        // What the plan needs before the KV cache: the weights and the temporary buffers.
        e.requested_bytes = bytes(&c, 2)
            .zip(bytes(&c, 3))
            .map(|(w, t)| w.saturating_add(t));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.metal_buffer) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("metal".into());
        e.requested_bytes = dec_or_hex(&c[1]);
        e.limit_bytes = c[2].parse::<u64>().ok().map(|mb| mb << 20);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.sophgo) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some(match c.get(1) {
            Some(d) => format!("sophgo {}", d.as_str()),
            None => "sophgo".into(),
        });
        e.requested_bytes = c.get(2).and_then(|m| dec_or_hex(m.as_str()));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.rknn) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("rknpu".into());
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.spark_device_store) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c[1].parse().ok();
        e.used_bytes = c.get(3).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.dali_alloc) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c.get(1).and_then(|m| m.as_str().parse().ok());
        e.device = c.get(2).map(|m| format!("GPU {}", m.as_str()));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.vllm_startup_free) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        // (Figures in GiB, as the message prints them.)
        let gib = |i: usize| {
            let v: f64 = c[i].parse().ok()?;
            Some((v * hbm_doctor_units::size::unit_bytes("GiB")? as f64) as u64)
        };
        e.free_bytes = gib(1);
        e.limit_bytes = gib(2);
        e.requested_bytes = gib(4);
        e.pool_setting = Some(format!("gpu_memory_utilization={}", &c[3]));
        // At start-up the engine holds nothing yet: what is not free is held by others.
        e.process_bytes = Some(0);
        e.stage = Some(crate::event::Stage::Init);
        if let (Some(l), Some(f)) = (e.limit_bytes, e.free_bytes) {
            e.holder_named = Some(format!(
                "{} of the device was in use before the engine started (the message: reduce GPU memory used by other processes)",
                hbm_doctor_units::size::format_size(l.saturating_sub(f))
            ));
        }
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.habana_workspace) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.device = Some("gaudi".into());
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.nki_bound.find(flat).filter(on_first) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Compile, flat);
        e.memory_space = Some(MemorySpace::Vmem);
        e.device = Some("neuron".into());
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.tcmalloc_nil) {
        let mut e = host_event(line, flat);
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.not_enough_enum.find(flat).filter(on_first) {
        let e = new_event(line, Family::Unrecognized, Phase::Runtime, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.dst_tensor.find(flat).filter(on_first) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.framework = Some(Framework::Tensorflow);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.neuron_sb.find(flat).filter(on_first) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Compile, flat);
        e.memory_space = Some(MemorySpace::Vmem);
        e.device = Some("neuron".into());
        // The figures are read with the report (`read_neuron_sb`).
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.neuron_device) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("neuron".into());
        e.requested_bytes = c[1].parse().ok();
        e.used_bytes = bytes(&c, 2);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.poplar_stream) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Compile, flat);
        e.device = Some("ipu".into());
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.xpu_block) {
        let mut e = gpu_event(line, Family::PytorchCudaOom, flat);
        e.framework = Some(Framework::Pytorch);
        e.requested_bytes = bytes(&c, 2);
        e.device = c.get(3).map(|d| format!("XPU {}", d.as_str()));
        e.limit_bytes = bytes(&c, 4);
        e.used_bytes = bytes(&c, 5);
        e.allocated_bytes = e.used_bytes;
        e.message = format!(
            "{} (one block may not exceed {} GB)",
            e.message.lines().next().unwrap_or_default(),
            &c[1]
        );
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.directml) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("directml".into());
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.python_memory_error.find(flat).filter(on_first) {
        return Some((Piece::Event(Box::new(host_event(line, flat))), m.end()));
    }
    if let Some(m) = pat.torch_notebook.find(flat).filter(on_first) {
        let mut e = gpu_event(line, Family::PytorchCudaOom, flat);
        e.framework = Some(Framework::Pytorch);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.ort_arena) {
        let mut e = new_event(line, Family::Unrecognized, Phase::Runtime, flat);
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.iree_hip) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c.get(1).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.openvino_cap) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c[1].parse().ok();
        e.message = format!(
            "one memory object of {} bytes requested (one block may not exceed {} bytes)",
            &c[1], &c[2]
        );
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.openvino_gpu.find(flat).filter(on_first) {
        let e = gpu_event(line, Family::Unrecognized, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.rmm_initial) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = parse_size(&format!("{} MB", &c[1]));
        e.free_bytes = parse_size(&format!("{} MB", &c[2]));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.catboost_ctrs) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.free_bytes = parse_size(&format!("{} MB", &c[1]));
        e.requested_bytes = parse_size(&format!("{} MB", &c[2]));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.coreml) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.nvmap.find(flat).filter(on_first) {
        let e = gpu_event(line, Family::Unrecognized, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.opencl_alloc.find(flat).filter(on_first) {
        let e = gpu_event(line, Family::Unrecognized, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.mindspore_total) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        let n = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<u64>().ok());
        e.used_bytes = n(1).map(|u| u.saturating_add(n(2).unwrap_or(0)));
        e.requested_bytes = n(3);
        e.limit_bytes = n(4);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.warp_array) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.device = Some(c[1].to_string());
        e.requested_bytes = c[2].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.llm_engine_vram.find(flat).filter(on_first) {
        let e = gpu_event(line, Family::Unrecognized, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.metal_command_buffer.find(flat).filter(on_first) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.device = Some("metal".into());
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.ray_node) {
        let mut e = host_event(line, flat);
        e.used_bytes = bytes(&c, 1);
        e.limit_bytes = bytes(&c, 2);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.k8s_evicted.find(flat).filter(on_first) {
        return Some((Piece::Event(Box::new(host_event(line, flat))), m.end()));
    }
    if let Some(m) = pat.cpp_bad_alloc.find(flat).filter(on_first) {
        return Some((Piece::Event(Box::new(host_event(line, flat))), m.end()));
    }
    if let Some(c) = at_head(&pat.mps) {
        // A name quoted in a sentence (`users hit either "MPS backend out of memory" or
        // SIGKILL`) is talk.
        let at = c.get(0)?.start();
        let quoted = flat[..at].ends_with(['"', '\'', '`']);
        if !quoted {
            let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
            e.framework = Some(Framework::Pytorch);
            e.memory_space = Some(MemorySpace::Device);
            e.device = Some("mps".into());
            e.used_bytes = bytes(&c, 1);
            e.limit_bytes = bytes(&c, 3);
            e.requested_bytes = bytes(&c, 4);
            return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
        }
    }
    if let Some(m) = pat.win_paging.find(flat).filter(on_first) {
        let e = host_event(line, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.miopen) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c[1].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.pinned) {
        let mut e = host_event(line, flat);
        e.requested_bytes = bytes(&c, 1);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.paddle) {
        // A framework outside the contract's vocabulary: its figures, no framework named.
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.device = Some(format!("GPU {}", &c[1]));
        e.requested_bytes = bytes(&c, 2);
        e.used_bytes = bytes(&c, 3);
        e.free_bytes = bytes(&c, 4);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.torch_async) {
        let mut e = gpu_event(line, Family::PytorchCudaOom, flat);
        e.framework = Some(Framework::Pytorch);
        e.device = c
            .get(1)
            .filter(|d| !d.as_str().is_empty())
            .map(|d| format!("GPU {}", d.as_str()));
        // The figures, one per line, are read with the report (`read_async_figures`); a paste
        // that flattened them onto the headline's line is read here, key by key.
        let rest = &flat[c.get(0)?.end()..];
        let rest = &rest[..rest.find('\n').unwrap_or(rest.len())];
        let mut at: Vec<usize> = [
            "Currently allocated",
            "Requested",
            "Device limit",
            "Free (according to CUDA)",
            "PyTorch limit",
        ]
        .iter()
        .filter_map(|k| rest.find(k))
        .collect();
        at.sort_unstable();
        let mut pending = false;
        for (i, &start) in at.iter().enumerate() {
            let end = at.get(i + 1).copied().unwrap_or(rest.len());
            read_async_figures(&mut e, rest[start..end].trim(), &mut pending);
        }
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.torch_new) {
        let mut e = gpu_event(line, Family::PytorchCudaOom, flat);
        e.framework = Some(Framework::Pytorch);
        e.requested_bytes = bytes(&c, 1);
        // (Some prints leave the ordinal out: `GPU  has a total capacity of ...`.)
        e.device = (!c[2].is_empty()).then(|| format!("GPU {}", &c[2]));
        e.limit_bytes = bytes(&c, 3);
        e.free_bytes = bytes(&c, 4);
        let mut end = c.get(0)?.end();
        // `1.05 GiB allowed;`: PyTorch prints it only when a per-process memory fraction caps
        // the caching allocator (torch.cuda.set_per_process_memory_fraction).
        if let Some(a) = pat.torch_allowed.captures(flat) {
            e.pool_setting = Some(format!(
                "set_per_process_memory_fraction ({} allowed)",
                &a[1]
            ));
        }
        if let Some(u) = pat.torch_unallocated.captures(flat) {
            e.used_bytes = bytes(&u, 1);
            e.allocated_bytes = e.used_bytes;
            e.fragmentation_bytes = bytes(&u, 2);
            end = end.max(u.get(0)?.end());
        }
        // What the process holds in use (PyTorch's allocations and everything else it has on the
        // device) is what it uses; "allocated by PyTorch" is part of it.
        // Older torch lists every process with `Process N has`, its own first; newer torch says
        // `this process has` for its own and `Process N has` for the others.
        // Several `Process N has` and no `this process has`: which one is this process the
        // message does not say; what PyTorch allocated is the figure it states for it, and the
        // list itself shows other processes on the device.
        let listed: Vec<_> = pat
            .torch_process
            .find_iter(flat)
            .filter(|m| m.as_str().starts_with("Process"))
            .collect();
        let this = pat.torch_this_process.captures(flat);
        if this.is_none() && listed.len() >= 2 {
            e.holder_named = Some(format!(
                "{} processes hold memory on the device ({})",
                listed.len(),
                listed
                    .iter()
                    .map(|m| m.as_str().split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
            end = end.max(listed.last()?.end());
        } else if let Some(pc) = this.or_else(|| pat.torch_process.captures(flat)) {
            e.process_bytes = bytes(&pc, 1);
            e.used_bytes = e.process_bytes.or(e.used_bytes);
            end = end.max(pc.get(0)?.end());
        }
        // Beside `this process has`, every `Process N has X memory in use` is another process
        // on the same GPU: the message itself names what holds the device.
        if pat.torch_this_process.is_match(flat) {
            if let Some(other) = pat
                .torch_process
                .find_iter(flat)
                .find(|m| m.as_str().starts_with("Process"))
            {
                e.holder_named = Some(
                    other
                        .as_str()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
        }
        return Some((Piece::Event(Box::new(e)), end));
    }
    if let Some(c) = at_head(&pat.cpu_allocator).or_else(|| at_head(&pat.cpu_enforce)) {
        let mut e = host_event(line, flat);
        e.framework = Some(Framework::Pytorch);
        e.requested_bytes = c.get(1).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    // The older message whole, or cut after its capacity (the same first four figures).
    let whole = at_head(&pat.torch_old);
    let cut = whole
        .is_none()
        .then(|| at_head(&pat.torch_old_cut))
        .flatten();
    if let Some(c) = whole.as_ref().or(cut.as_ref()) {
        let mut e = gpu_event(line, Family::PytorchCudaOom, flat);
        e.framework = Some(Framework::Pytorch);
        e.requested_bytes = bytes(c, 1);
        e.device = Some(format!("GPU {}", &c[2]));
        e.limit_bytes = bytes(c, 3);
        e.used_bytes = bytes(c, 4);
        e.allocated_bytes = e.used_bytes;
        if whole.is_none() {
            return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
        }
        e.free_bytes = bytes(c, 5);
        // Reserved by PyTorch but not allocated: the caching allocator's idle blocks. PyTorch 1.x
        // printed them as `X cached` (the cache beyond what is allocated: `6.01 GiB already
        // allocated; ... 2.62 GiB cached`); later versions print the whole reservation
        // (`X reserved in total by PyTorch`).
        if let Some(reserved) = bytes(c, 7) {
            e.fragmentation_bytes = e.used_bytes.map(|u| reserved.saturating_sub(u));
            e.process_bytes = Some(reserved);
        } else if let Some(cached) = bytes(c, 6) {
            e.fragmentation_bytes = Some(cached);
            e.process_bytes = e.used_bytes.map(|u| u.saturating_add(cached));
        }
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.cupy) {
        let mut e = gpu_event(line, Family::CudaOom, flat);
        e.requested_bytes = bytes(&c, 1);
        e.used_bytes = bytes(&c, 2);
        // The pool's limit, set by the program: the allocator's wall, not the device's.
        if let Some(l) = bytes(&c, 3) {
            e.limit_bytes = Some(l);
            e.pool_setting = Some(format!("mempool.set_limit({l})"));
        }
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.numpy_host) {
        let mut e = host_event(line, flat);
        e.requested_bytes = match (c.get(1), c.get(2), c.get(3), c.get(4)) {
            (Some(n), Some(u), _, _) => parse_size(&format!(
                "{} {}",
                n.as_str().trim_end_matches('.'),
                u.as_str()
            )),
            (_, _, Some(shape), Some(dtype)) => numpy_bytes(shape.as_str(), dtype.as_str()),
            _ => None,
        };
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.ggml_buffer) {
        let backend = c.get(1).or(c.get(2)).map_or("", |m| m.as_str());
        let mut e = if backend == "cpu" {
            host_event(line, flat)
        } else if backend.starts_with("cuda") {
            gpu_event(line, Family::CudaOom, flat)
        } else {
            gpu_event(line, Family::OtherAccelerator, flat)
        };
        e.requested_bytes = c[3].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.ggml_pool) {
        let mut e = new_event(line, Family::Unrecognized, Phase::Runtime, flat);
        e.requested_bytes = c[1].parse().ok();
        e.free_bytes = c[2].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.tvm_storage) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = c[1].parse().ok();
        e.limit_bytes = c[2].parse().ok();
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.vulkan.find(flat).filter(on_first) {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.backend = Some(Backend::Gpu);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.tgi_prefill) {
        let mut e = gpu_event(line, Family::VllmKvCache, flat);
        e.framework = Some(Framework::Pytorch);
        e.message = format!("not enough memory for {} prefill tokens", &c[1]);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.catboost) {
        let mut e = gpu_event(line, Family::Unrecognized, flat);
        e.requested_bytes = parse_size(&format!("{} MB", &c[1]));
        e.free_bytes = parse_size(&format!("{} MB", &c[2]));
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.cuda_driver.find(flat).filter(on_first) {
        // Pinned host memory (`cudaMallocHost`, `cudaHostAlloc`): the host's RAM ran out.
        if m.as_str().contains("cudaMallocHost") || m.as_str().contains("cudaHostAlloc") {
            return Some((Piece::Event(Box::new(host_event(line, flat))), m.end()));
        }
        let mut e = gpu_event(line, Family::CudaOom, flat);
        e.requested_bytes = pat.ggml_alloc.captures(flat).and_then(|c| bytes(&c, 1));
        for c in pat.figures_told.captures_iter(flat) {
            e.free_bytes = e.free_bytes.or_else(|| bytes(&c, 1));
            e.requested_bytes = e.requested_bytes.or_else(|| bytes(&c, 2)).or_else(|| {
                c.get(3)
                    .or(c.get(4))
                    .or(c.get(5))
                    .or(c.get(6))
                    .or(c.get(7))
                    .and_then(|m| m.as_str().parse().ok())
            });
        }
        // TF 1.x's context creation: `CUDA_ERROR_OUT_OF_MEMORY; total memory reported: N`.
        if let Some(t) = flat.find("total memory reported: ") {
            let digits: String = flat[t + 23..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            e.limit_bytes = digits.parse().ok();
        }
        if flat.contains("torch") {
            e.framework = Some(Framework::Pytorch);
        }
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.vllm_max_len) {
        let mut e = gpu_event(line, Family::VllmKvCache, flat);
        e.framework = Some(Framework::Pytorch);
        e.message = format!(
            "max model length {} tokens, KV cache holds {} tokens",
            &c[1], &c[2]
        );
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.vllm_needed) {
        // vLLM runs on GPUs and TPUs: the backend is left to the text around it.
        let mut e = new_event(line, Family::VllmKvCache, Phase::Runtime, flat);
        e.framework = Some(Framework::Pytorch);
        e.requested_bytes = bytes(&c, 1);
        e.free_bytes = bytes(&c, 2);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.llvm_jit.find(flat).filter(on_first) {
        // Quoted in a sentence (`tracebacks including "JIT session error: Cannot allocate
        // memory"`, a pull request's description): named, not printed.
        if flat[..m.start()].ends_with(['"', '\'', '`'])
            && flat[..first].split_whitespace().count() >= 8
        {
            return None;
        }
        let e = host_event(line, flat);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.vllm_negative.find(flat).filter(on_first) {
        // vLLM runs on GPUs and TPUs: the backend is left to the text around it.
        let mut e = new_event(line, Family::VllmKvCache, Phase::Runtime, flat);
        e.framework = Some(Framework::Pytorch);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(m) = pat.sglang_pool.find(flat).filter(on_first) {
        return Some((
            Piece::Event(Box::new(gpu_event(line, Family::VllmKvCache, flat))),
            m.end(),
        ));
    }
    if let Some(m) = pat.vllm_cache.find(flat).filter(on_first) {
        let mut e = gpu_event(line, Family::VllmKvCache, flat);
        e.framework = Some(Framework::Pytorch);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.constant) {
        let mut e = new_event(line, Family::GpuOomAllocate, Phase::Runtime, flat);
        e.requested_bytes = bytes(&c, 1);
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(c) = at_head(&pat.gpu_shared) {
        let mut e = gpu_event(line, Family::GpuSharedMemory, flat);
        e.memory_space = Some(MemorySpace::Vmem);
        e.requested_bytes = c.get(1).or(c.get(3)).and_then(|m| m.as_str().parse().ok());
        e.limit_bytes = c.get(2).or(c.get(4)).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    if let Some(m) = pat.gpu_shared_runtime.find(flat).filter(on_first) {
        let mut e = gpu_event(line, Family::GpuSharedMemory, flat);
        e.memory_space = Some(MemorySpace::Vmem);
        return Some((Piece::Event(Box::new(e)), m.end()));
    }
    if let Some(c) = at_head(&pat.ptxas_shared) {
        let mut e = gpu_event(line, Family::GpuSharedMemory, flat);
        e.phase = Phase::Compile;
        e.memory_space = Some(MemorySpace::Vmem);
        let num = |m: Option<regex::Match<'_>>| {
            let t = m?.as_str();
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => t.parse().ok(),
            }
        };
        e.requested_bytes = num(c.get(2));
        e.limit_bytes = num(c.get(3));
        e.program = Some(c[1].to_string());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    // Older tt-metal threw the message unformatted: `{}` placeholders, each value on a line of its
    // own after it. Put them back before reading.
    let filled;
    let (flat, first, placeholders_end) = match fill_placeholders(flat, first) {
        Some((text, first_len, end)) => {
            filled = text;
            (filled.as_str(), first_len, Some(end))
        }
        None => (flat, first, None),
    };
    // (`flat` and `first` are the filled text's from here on: `at_head` reads the original.)
    let on_first = |m: &regex::Match<'_>| m.start() <= first;
    if let Some(c) = pat
        .tenstorrent
        .captures(flat)
        .filter(|c| c.get(0).is_some_and(|m| on_first(&m)))
    {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.requested_bytes = bytes(&c, 1);
        e.memory_space = Some(if &c[2] == "DRAM" {
            MemorySpace::Device
        } else {
            MemorySpace::Vmem
        });
        // The buffer is split evenly over the banks: per-bank figures times the bank count are
        // the device's (a bank's largest free block times the banks is the most one buffer gets).
        if let Some(banks) = c.get(3).and_then(|m| m.as_str().parse::<u64>().ok()) {
            let per_bank = |i| bytes(&c, i).map(|b| b.saturating_mul(banks));
            e.limit_bytes = per_bank(5);
            e.used_bytes = per_bank(6);
            e.free_bytes = per_bank(7);
            e.largest_free_bytes = per_bank(8);
        }
        let end = placeholders_end.unwrap_or(c.get(0)?.end());
        return Some((Piece::Event(Box::new(e)), end));
    }
    if let Some(c) = pat
        .gaudi
        .captures(flat)
        .filter(|c| c.get(0).is_some_and(|m| on_first(&m)))
    {
        let mut e = new_event(line, Family::OtherAccelerator, Phase::Runtime, flat);
        e.memory_space = Some(MemorySpace::Device);
        e.requested_bytes = c.get(1).and_then(|m| m.as_str().parse().ok());
        return Some((Piece::Event(Box::new(e)), c.get(0)?.end()));
    }
    None
}

/// `flat` with the `{}` of its first line replaced by the lines that follow it, one value a
/// line (`Not enough space to allocate {} B {} buffer` / `148897792` / `DRAM`): the new text, the
/// length of its first line, and where in `flat` the last value used ends. `None` when the first
/// line has no placeholder.
fn fill_placeholders(flat: &str, first: usize) -> Option<(String, usize, usize)> {
    let head = &flat[..first.min(flat.len())];
    if !head.contains("{}") || !head.contains("Not enough space") {
        return None;
    }
    let mut lines = flat[first.min(flat.len())..].split_inclusive('\n');
    let mut end = first;
    let mut out = String::with_capacity(flat.len());
    let mut parts = head.split("{}").peekable();
    while let Some(part) = parts.next() {
        out.push_str(part);
        if parts.peek().is_none() {
            break;
        }
        // The next line that holds one value; a line with spaces is prose, not a value.
        let value = loop {
            let Some(l) = lines.next() else {
                break None;
            };
            end += l.len();
            let v = l.trim();
            if !v.is_empty() {
                break (!v.contains(' ')).then_some(v);
            }
        };
        out.push_str(value.unwrap_or("{}"));
    }
    let first_len = out.len();
    out.push('\n');
    out.push_str(&flat[end.min(flat.len())..]);
    Some((out, first_len, end))
}

/// The figures of AWS Neuron's state-buffer failure, a few lines under its headline:
/// `Total Accessed Bytes per partition by instruction: 198024` (what the instruction needs per
/// partition) and `Total SB Partition Size: 196608` (what a partition holds).
pub(crate) fn read_neuron_sb(e: &mut Event, t: &str) {
    let value = |t: &str| {
        t.rsplit(':')
            .next()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if t.starts_with("Total Accessed Bytes per partition") {
        e.used_bytes = e.used_bytes.or(value(t));
    } else if t.starts_with("Total SB Partition Size") {
        e.limit_bytes = e.limit_bytes.or(value(t));
    }
}

/// The figures of PyTorch's cudaMallocAsync message, one per line under its headline
/// (`Currently allocated     : 21.55 GiB`). `pending_limit` carries the `PyTorch limit (set by
/// user-supplied memory fraction)` label to its value on the next line (`: 8.00 GiB`); a value
/// above the device's limit is the unset default (`17179869184.00 GiB`), not a cap.
pub(crate) fn read_async_figures(e: &mut Event, t: &str, pending_limit: &mut bool) {
    let value = |t: &str| {
        t.split_once(':')
            .and_then(|(_, v)| parse_size(v.trim().trim_end_matches('.')))
    };
    let pytorch_limit = |e: &mut Event, v: Option<u64>| {
        if let (Some(v), Some(l)) = (v, e.limit_bytes) {
            if v < l {
                e.pool_setting = e.pool_setting.take().or_else(|| {
                    Some(format!(
                        "PyTorch memory fraction limit {}",
                        crate::format_size(v)
                    ))
                });
            }
        }
    };
    if *pending_limit {
        *pending_limit = false;
        if t.starts_with(':') {
            pytorch_limit(e, value(t));
            return;
        }
    }
    let key = t.split(':').next().unwrap_or("").trim();
    match key {
        "Currently allocated" => {
            e.used_bytes = e.used_bytes.or(value(t));
            e.allocated_bytes = e.allocated_bytes.or(e.used_bytes);
        }
        "Requested" => e.requested_bytes = e.requested_bytes.or(value(t)),
        "Device limit" => e.limit_bytes = e.limit_bytes.or(value(t)),
        "Free (according to CUDA)" => e.free_bytes = e.free_bytes.or(value(t)),
        _ if key.starts_with("PyTorch limit") => {
            if t.contains("):") || t.ends_with(':') {
                pytorch_limit(e, value(t.rsplit_once("):").map_or(t, |(_, v)| v)));
            } else {
                *pending_limit = true;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::{scan_all, Family, Framework};

    const GIB: f64 = (1u64 << 30) as f64;

    fn g(b: Option<u64>) -> f64 {
        (b.unwrap_or(0) as f64 / GIB * 100.0).round() / 100.0
    }

    #[test]
    fn gpu_shared_memory_of_a_kernel() {
        use crate::event::{MemorySpace, Phase};
        let ev = scan_all(b"XlaRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded:\nrequested 1179648, available: 232448\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::GpuSharedMemory);
        assert_eq!(ev[0].memory_space, Some(MemorySpace::Vmem));
        assert_eq!(
            (ev[0].requested_bytes, ev[0].limit_bytes),
            (Some(1_179_648), Some(232_448))
        );
        let ev = scan_all(b"E nvptx_compiler.cc:414] ptxas error   : Entry function 'fusion_42' uses too much shared data (0xc600 bytes, 0xc000 max)\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].phase, Phase::Compile);
        assert_eq!(
            (ev[0].requested_bytes, ev[0].limit_bytes),
            (Some(0xc600), Some(0xc000))
        );
        assert_eq!(ev[0].program.as_deref(), Some("fusion_42"));
    }

    #[test]
    fn vllm_v1_kv_cache_and_llvm_jit_memory() {
        let ev = scan_all(b"ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (0.71 GiB). Based on the available memory, the estimated maximum model length is 5632.\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::VllmKvCache);
        assert_eq!(g(ev[0].requested_bytes), 16.0);
        assert_eq!(g(ev[0].free_bytes), 0.71);
        let ev = scan_all(
            b"JIT session error: Cannot allocate memory\nFatal Python error: Segmentation fault\n",
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::HostOom);
    }

    #[test]
    fn tt_metal_unformatted_placeholders() {
        let text = "RuntimeError: TT_THROW @ tt_metal/impl/allocator/allocator.cpp:107: tt::exception\ninfo:\nOut of Memory: Not enough space to allocate {} B {} buffer across {} banks, where each bank needs to store {} B\n148897792\nDRAM\n8\n18612224\nbacktrace:\n";
        let ev = scan_all(text.as_bytes());
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::OtherAccelerator);
        assert_eq!(ev[0].requested_bytes, Some(148_897_792));
    }

    #[test]
    fn pytorch_cuda_both_generations() {
        let new = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 14.75 GiB of which 3.06 MiB is free. Process 2423 has 14.74 GiB memory in use. Of the allocated memory 14.28 GiB is allocated by PyTorch, and 330.05 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n";
        let e = &scan_all(new.as_bytes())[0];
        assert_eq!(e.family, Family::PytorchCudaOom);
        assert_eq!(e.framework, Some(Framework::Pytorch));
        assert_eq!(e.requested_bytes, Some(20 << 20));
        assert_eq!(g(e.limit_bytes), 14.75);
        assert_eq!(g(e.used_bytes), 14.74);
        assert_eq!(g(e.process_bytes), 14.74);
        assert!(e.free_bytes.is_some_and(|f| f > 3 << 20 && f < 4 << 20));
        let old = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 12.23 GiB already allocated; 1.43 GiB free; 13.23 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.\n";
        let e = &scan_all(old.as_bytes())[0];
        assert_eq!(e.family, Family::PytorchCudaOom);
        assert_eq!(g(e.requested_bytes), 2.0);
        assert_eq!(g(e.limit_bytes), 15.78);
        assert_eq!(g(e.used_bytes), 12.23);
        assert_eq!(g(e.free_bytes), 1.43);
        assert_eq!(g(e.fragmentation_bytes), 1.0);
    }

    #[test]
    fn pytorch_cuda_retyped_and_rewrapped() {
        // Retyped: lower case, no space before the parenthesis, `totalcapacity`, no space after `;`.
        let e = &scan_all(b"but l got this problem cuda out of memory, tried to allocate 50MiB(GPU 0; 1.96GiB totalcapacity;1.33GiB already allocated; 43.5MiB free;1.36 GiB reserved in total by Pytorch)\n")[0];
        assert_eq!(e.family, Family::PytorchCudaOom);
        assert_eq!(e.requested_bytes, Some(50 << 20));
        assert_eq!(g(e.limit_bytes), 1.96);
        assert_eq!(g(e.used_bytes), 1.33);
        // Re-wrapped by hand, the parentheses dropped.
        let e = &scan_all(b"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB \nGPU 0; 8.00 GiB total capacity; 7.20 GiB already allocated; 0 bytes free; 7.30 GiB reserved in total by PyTorch\n")[0];
        assert_eq!((g(e.limit_bytes), g(e.used_bytes)), (8.0, 7.2));
        assert_eq!(e.free_bytes, Some(0));
        // Wrapped at a word boundary, and torch 2.1's `capacty`.
        let e = &scan_all(b"RuntimeError: CUDA out of memory. Tried to allocate 112.00 MiB. GPU 0 has a total capacty of 44.35 GiB\nof which 53.38 MiB is free. Process 3663367 has 44.28 GiB memory\nin use.\n")[0];
        assert_eq!(e.family, Family::PytorchCudaOom);
        assert_eq!((g(e.limit_bytes), g(e.used_bytes)), (44.35, 44.28));
    }

    #[test]
    fn cuda_runtime_spellings() {
        for text in [
            "CUDA status Error: file: ./src/dark_cuda.c : () : line: 373\nCUDA Error: out of memory\n",
            "and fails on the third card (CUDA error: Out of memory).\n",
            "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=405 error=2 : out of memory\nRuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCGeneral.cpp:405\n",
            "CUDA Runtime Error at: /src/data_struct_cuda.cu:83\nout of memory cudaMalloc(&this->d_jcb, size * sizeof(float))\n",
            "ERROR - Cannot create Cublas handle. Cublas won't be available.\n",
        ] {
            let ev: Vec<_> = scan_all(text.as_bytes()).into_iter().filter(|e| e.fatal).collect();
            assert_eq!(ev.len(), 1, "{text}");
            assert_eq!(ev[0].family, Family::CudaOom, "{text}");
        }
        let e = &scan_all(b"cupy.cuda.memory.OutOfMemoryError: out of memory to allocate 1073741824 bytes (total 12373894656 bytes)\n")[0];
        assert_eq!(e.family, Family::CudaOom);
        assert_eq!(e.requested_bytes, Some(1_073_741_824));
        let ev = scan_all(b"INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.\n");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].family, Family::VllmKvCache);
        assert!(scan_all(
            b"INFO worker.py:267] the rest of the memory reserved for KV Cache is 1.05GiB.\n"
        )
        .is_empty());
    }

    #[test]
    fn cuda_driver_cupy_vllm_and_others() {
        for (text, family) in [
            ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n", Family::CudaOom),
            ("numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY\n", Family::CudaOom),
            ("cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes (allocated so far: 3,221,225,472 bytes).\n", Family::CudaOom),
            ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n", Family::VllmKvCache),
            ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (10000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n", Family::VllmKvCache),
            ("RuntimeError: Out of Memory: Not enough space to allocate 2147483648 B DRAM buffer across 12 banks, where each bank needs to store 178956800 B\n", Family::OtherAccelerator),
            ("RuntimeError: synStatus=26 [Device memory allocation failed]. DEVMEM allocation failed\n", Family::OtherAccelerator),
        ] {
            let ev = scan_all(text.as_bytes());
            assert_eq!(ev.len(), 1, "{text}");
            assert_eq!(ev[0].family, family, "{text}");
            assert!(ev[0].fatal);
        }
        let e = &scan_all(b"cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes (allocated so far: 3,221,225,472 bytes).\n")[0];
        assert_eq!(e.requested_bytes, Some(1_073_741_824));
        assert_eq!(e.used_bytes, Some(3_221_225_472));
        assert_eq!(
            scan_all(b"RuntimeError: Out of Memory: Not enough space to allocate 2147483648 B DRAM buffer across 12 banks\n")[0].requested_bytes,
            Some(2_147_483_648)
        );
    }
}

"""Hopper implicit-GEMM kernel for the VAE's causal k_t×3×3 convs (Pallas Mosaic GPU), bf16 or FP8.

Why: the exact Wan2.2 decoder is conv-bound (29.4 TFLOP per 480×832 chunk) and XLA emits no FP8
convolution (conv_kernel.md, beside this file); FP8 tensor cores are the only way below
its bf16 floor. Numerics are checked on the CPU in Mosaic GPU's interpret mode (bf16, and FP8 with
(K, N) weights, see kernel_rows). On an H200 the FP8 kernel alone runs at 977–1,242 TFLOP/s on the
decoder's big shapes; a whole call, with its operand preparation (a third of it), takes 0.66–0.82×
of cuDNN's bf16 conv time, the bf16 kernel 1.1–1.5× (bench/bench_conv.py; conv_kernel.md);
the VAE decoder is served with it on Hopper GPUs when given static FP8 scales (vae_conv.py
plugs it into models/vae.py; vae_fp8.py calibrates the scales).

The layout trick. Pad each frame to (H + kh − 1) rows × Wp columns (Wp a multiple of 8) and flatten
(frame, row, column) into one pixel axis; stack the kw horizontal taps on channels (x3[p] = x[p],
x[p+1], x[p+2]). Output pixel q on that padded grid then reads input row q + dt·S + dh·Wp for tap
(dt, dh) (S = rows·Wp per frame): every tap is a constant row shift of one 2-D [pixels, kw·C]
array. The conv is a GEMM whose K loop runs over (tap, channel block), each A tile a plain 2-D TMA
box at a shifted row; outputs on pad rows/columns are computed and sliced away (≈ 3% at 240×416).
The horizontal taps go on channels because Mosaic's TMA into tiled shared memory needs row offsets
that are multiples of 8: dt·S and dh·Wp are, a shift by dw would not be. `ConvTiles.taps_in_kernel`
(the serving default) skips that 3× copy: each K step's TMA starts dw rows later, into plain shared
memory read through registers (H200: same output bits as the stacked taps; a queued decode chunk
2.3–2.5 ms faster).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
from jax import lax

from rynn_jax.models import fp8_linear as fp8_lib


@dataclasses.dataclass(frozen=True)
class ConvTiles:
    """Work split of one CTA: two compute warpgroups of `tile_m` output pixels × `tile_n` channels
    each (accumulators in registers: 64×256 f32 is the Hopper maximum), K in 128-byte steps."""
    tile_m: int = 64
    tile_n: int = 256
    stages: int = 4  # TMA pipeline depth (shared memory: stages × 48 KB for the default tiles)
    epi_n: int = 64  # output columns per epilogue store
    num_sms: int | None = None  # persistent grid size; None: the GPU's SM count (2 when interpreted)
    cluster_m: bool = False  # pairs of CTAs on neighbouring M tiles share (multicast) each weight tile
    overlap: int = 0  # wgmma groups left in flight per step (slots released that many steps late)
    # Tile order. "rows": consecutive CTAs take consecutive pixel tiles, so the three frames a tile
    # reads (dt = 0, 1, 2) are far apart and each input row comes from HBM once per dt. "frames":
    # consecutive CTAs take the same tile position in consecutive output frames (each frame's output
    # padded to whole tiles), so a wave's dt shifts land on rows its neighbours just loaded.
    order: str = "rows"
    # Horizontal taps. False: the prologue stacks them on channels (3× the input bytes; every A tile
    # then feeds wgmma from shared memory). True: the input is not stacked; the TMA of each K step
    # starts dw rows later into plain (unswizzled) shared memory and each warpgroup loads its rows
    # into registers for a register-lhs wgmma. Interpreted (wgmma then reads the tile from shared
    # memory) it gives the stacked kernel's bits; the register load is checked on a GPU only
    # (tests/test_conv_kernel.py's GPU test: bit-identical on an H200, bf16 and FP8;
    # bench/bench_conv.py --taps-in-kernel).
    taps_in_kernel: bool = False

    @property
    def m_unit(self) -> int:
        """Output rows per cluster step: the row count is padded to a multiple of it."""
        return self.cta_m * (2 if self.cluster_m else 1)

    def tile_k(self, dtype: Any) -> int:
        return 128 // jnp.dtype(dtype).itemsize  # one 128-byte swizzle row

    @property
    def cta_m(self) -> int:
        return 2 * self.tile_m


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static geometry of one call."""
    batch: int
    taps: tuple[int, int]  # (k_t, k_h): one A-row shift dt·frame + dh·row per tap, K order (dt, dh)
    frame: int  # rows per padded frame (a multiple of 8)
    row: int  # row pitch Wp (a multiple of 8)
    rows_in: int  # input rows per batch item (flattened padded frames + zero tail)
    rows_out: int  # output rows per batch item (a multiple of the tiles' m_unit)
    blocks: int = 1  # output blocks visited before the next tile position ("frames" order: T)
    block_in: int = 0  # input rows between blocks (the frame, or 0 for one block)
    block_out: int = 0  # output rows per block (a multiple of m_unit)
    kw: int = 1  # horizontal taps read by the kernel (1: stacked on channels by the prologue)


def _kernel(x_gmem, w_gmem, out_gmem, *, plan: _Plan, tiles: ConvTiles, kmajor: bool, interpreted: bool):
    import jax.experimental.pallas as pl
    import jax.experimental.pallas.mosaic_gpu as plgpu

    dtype, out_dtype = x_gmem.dtype, out_gmem.dtype
    c = x_gmem.shape[1]
    n_total = out_gmem.shape[1]
    tile_m, tile_n, tile_k, cta_m = tiles.tile_m, tiles.tile_n, tiles.tile_k(dtype), tiles.cta_m
    clusters = 2 if tiles.cluster_m else 1
    n_tiles = n_total // tile_n
    m_units = (plan.block_out or plan.rows_out) // (cta_m * clusters)  # per block
    k_per_tap = c // tile_k  # K steps per tap (per (dt, dh, dw) when the kernel reads the dw taps)
    taps = plan.taps[0] * plan.taps[1] * plan.kw

    def tiled(dt: Any, minor: int) -> tuple:
        swizzle = plgpu.find_swizzle(minor * jnp.dtype(dt).itemsize * 8)
        return plgpu.TilingTransform((8, swizzle // jnp.dtype(dt).itemsize)), plgpu.SwizzleTransform(swizzle)

    def a_row(step: jax.Array) -> jax.Array:
        tap = lax.div(step, jnp.int32(k_per_tap * plan.kw))  # (dt, dh); non-negative: plain division
        kh = jnp.int32(plan.taps[1])
        # Written as multiples of frame and row so that Mosaic sees the offset is 8-aligned.
        row = lax.div(tap, kh) * plan.frame + lax.rem(tap, kh) * plan.row
        if plan.kw > 1:  # the dw tap: a shift of the TMA's global row, any offset (plain shared memory)
            row = row + lax.rem(lax.div(step, jnp.int32(k_per_tap)), jnp.int32(plan.kw))
        return row

    def pipeline(body, context, a_base):
        # A tile shifted by dw rows: TMA takes any global offset into plain shared memory, not into
        # tiled/swizzled memory (Mosaic's layout inference refuses the unaligned row); plain memory
        # cannot feed wgmma directly, so each warpgroup loads its rows into registers (bank
        # conflicts likely: to be timed).
        a_transforms = () if plan.kw > 1 else tiled(dtype, tile_k)
        a_spec = plgpu.BlockSpec((pl.Element(cta_m), tile_k),
                                 lambda k: (a_base + a_row(k), lax.rem(k, jnp.int32(k_per_tap))),
                                 transforms=a_transforms, memory_space=plgpu.SMEM,
                                 delay_release=tiles.overlap)
        # FP8 wgmma wants both operands K-major: FP8 weights are stored (N, K).
        b_block, b_index = ((tile_n, tile_k), lambda k: (0, k)) if kmajor else ((tile_k, tile_n), lambda k: (k, 0))
        b_spec = plgpu.BlockSpec(b_block, b_index, transforms=tiled(dtype, b_block[1]), memory_space=plgpu.SMEM,
                                 collective_axes=("cluster",) if tiles.cluster_m else (),
                                 delay_release=tiles.overlap)
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(taps * k_per_tap,), memory_registers=40, in_specs=[a_spec, b_spec], wg_axis="wg",
            num_compute_wgs=2, max_concurrent_steps=tiles.stages, compute_context=context)

    def weight_tile(n_idx):
        cols = pl.ds(n_idx * tile_n, tile_n)
        return w_gmem.at[cols, :] if kmajor else w_gmem.at[:, cols]

    noop = lambda *_, **__: None  # noqa: E731

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(noop, noop, 0).get_allocations(x_gmem, weight_tile(0)),
        out_smem=plgpu.SMEM((2, 2, tile_m, tiles.epi_n), out_dtype, transforms=tiled(out_dtype, tiles.epi_n)),
        collective_axes="wg",
    )
    def _scope(allocs, out_smem):
        wg = lax.axis_index("wg")
        cta = lax.axis_index("cluster")

        @plgpu.nd_loop((plan.batch * m_units * plan.blocks * n_tiles,), collective_axes="cluster_grid")
        def _tile(info):
            (lin,) = info.index
            n_idx = lax.rem(lin, jnp.int32(n_tiles))  # N fastest: an A tile is reused from L2
            rest = lax.div(lin, jnp.int32(n_tiles))
            blk, rest = lax.rem(rest, jnp.int32(plan.blocks)), lax.div(rest, jnp.int32(plan.blocks))
            b, m_unit = lax.div(rest, jnp.int32(m_units)), lax.rem(rest, jnp.int32(m_units))
            m_idx = m_unit * clusters + cta
            out_rows = pl.ds(b * plan.rows_out + blk * plan.block_out + m_idx * cta_m + wg * tile_m, tile_m)

            def context(run):
                @functools.partial(pl.run_scoped, acc=plgpu.ACC((tile_m, tile_n), jnp.float32))
                def _acc(acc):
                    run(acc)
                    res = acc[...].astype(out_dtype)
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    for j in range(tile_n // tiles.epi_n):  # two store slots in flight
                        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                        out_smem[wg, j % 2] = res[:, j * tiles.epi_n:(j + 1) * tiles.epi_n]
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(
                            out_smem.at[wg, j % 2],
                            out_gmem.at[out_rows, pl.ds(n_idx * tile_n + j * tiles.epi_n, tiles.epi_n)])

            def body(_, a_smem, b_smem, acc):
                rhs = plgpu.transpose_ref(b_smem, (1, 0)) if kmajor else b_smem
                if plan.kw > 1 and not interpreted:  # plain shared memory: through registers
                    lhs = _load_rows(plgpu, a_smem, wg * tile_m, tile_m,
                                     plgpu.Layout.WGMMA_8BIT if jnp.dtype(dtype).itemsize == 1 else plgpu.Layout.WGMMA)
                else:
                    lhs = a_smem.at[pl.ds(wg * tile_m, tile_m)]
                plgpu.wgmma(acc, lhs, rhs)
                plgpu.wgmma_wait(tiles.overlap)  # reading acc after the loop waits for the rest
                return acc

            pipeline(body, context, b * plan.rows_in + blk * plan.block_in + m_idx * cta_m)(x_gmem, weight_tile(n_idx),
                                                                       allocations=allocs)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _load_rows(plgpu, ref, start, rows: int, layout):
    """rows [start, start + rows) of a shared-memory ref into registers (jax 0.10 takes the index
    as an argument, later versions as ref.at[...]). Keep `start` a multiple of 8: on an H200 (jax
    0.11.2) a start 1 or 2 rows off lowered but read garbage, not the shifted rows."""
    import jax.experimental.pallas as pl

    if inspect.signature(plgpu.load).parameters["idx"].default is inspect.Parameter.empty:
        return plgpu.load(ref, (pl.ds(start, rows), slice(None)), layout=layout, optimized=False)
    return plgpu.load(ref.at[pl.ds(start, rows)], layout=layout, optimized=False)


def _sm_count() -> int:
    """Streaming multiprocessors of the default device (132 on an H100 SXM / H200); 2 where there
    is no GPU (interpret mode simulates every CTA, so fewer is faster there)."""
    device = jax.devices()[0]
    return (getattr(device, "core_count", None) or 2) if device.platform == "gpu" else 2


def kernel_rows(x_rows: jax.Array, w: jax.Array, plan: _Plan, tiles: ConvTiles, interpret: Any = None) -> jax.Array:
    """The kernel alone on `prepare`d operands: (B·rows_out, N) bf16, unscaled."""
    import jax.experimental.pallas.mosaic_gpu as plgpu

    # The interpreted kernel differs from the real one in two ways: FP8 weights go K-major (N, K)
    # for the GPU, but the CPU interpreter cannot transpose shared-memory tiles, so there they stay
    # (K, N); and with in-kernel taps the GPU loads each plain A tile into registers (register-lhs
    # wgmma), which the interpreter cannot, so there wgmma reads the tile from shared memory.
    kmajor = jnp.dtype(x_rows.dtype).itemsize == 1 and interpret is None
    n = w.shape[0] if kmajor else w.shape[1]
    clusters = 2 if tiles.cluster_m else 1
    num_sms = tiles.num_sms or _sm_count()
    kern = plgpu.kernel(
        functools.partial(_kernel, plan=plan, tiles=tiles, kmajor=kmajor, interpreted=interpret is not None),
        out_type=jax.ShapeDtypeStruct((plan.batch * plan.rows_out, n), jnp.bfloat16),
        grid=(num_sms // clusters,), grid_names=("cluster_grid",), cluster=(clusters,), cluster_names=("cluster",),
        num_threads=3, thread_name="wg",  # two compute warpgroups + one TMA producer
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret,
    )
    return kern(x_rows, w)


def supports(kernel_shape: tuple[int, ...], dtype: Any, tiles: ConvTiles = ConvTiles()) -> bool:
    """Whether `causal_conv` takes this (k_t, k_h, k_w, C, N) kernel: odd k_h, k_w; k_w·C whole
    128-byte steps; N a multiple of 64 (the output tile shrinks to 128 or 64 to fit)."""
    kt, kh, kw, c, n = kernel_shape
    return kh % 2 == 1 and kw % 2 == 1 and (kw * c) % tiles.tile_k(dtype) == 0 and n % 64 == 0


# The tiles the VAE's convs use (vae_conv.KernelConv.tiles, fitted per conv by fitted_tiles).
# H200, static-FP8 decode chunk at 480×832 in one process (bench/profile_ops.py --conv-tiles rows
# frames_c2): kernel time 21.04 → 20.49 ms, all kernels 32.32 → 31.64 ms; the kernel alone at
# 240×416×256 (prepared operands) 1.255 → 1.138 ms. In-kernel horizontal taps (--conv-tiles
# frames_c2 frames_c2_hk, later-chunk program): all kernels 32.12 → 29.55 ms, 8 calls queued
# 33.73 → 31.46 ms per call (copies 3.82 → 0.54 ms: no tap stacking).
SERVING_TILES = ConvTiles(order="frames", cluster_m=True, taps_in_kernel=True)

# Named tile sets for the benches' --conv-tiles (each replaces SERVING_TILES in KernelConv.tiles): rows/frames
# order, _c2 = 2-CTA clusters, _s3 = 3 pipeline stages, _hk = horizontal taps read in the kernel
# (frames_c2_hk = SERVING_TILES).
TILE_PRESETS: dict[str, ConvTiles] = {
    "rows": ConvTiles(), "frames": ConvTiles(order="frames"), "rows_c2": ConvTiles(cluster_m=True),
    "frames_c2": ConvTiles(order="frames", cluster_m=True),
    "frames_c2_s3": ConvTiles(order="frames", cluster_m=True, stages=3),
    "frames_c2_hk": ConvTiles(order="frames", cluster_m=True, taps_in_kernel=True),
}


def fitted_tiles(n: int, tiles: ConvTiles) -> ConvTiles:
    """`tiles` with tile_n (and epi_n) cut to divide N: 256 → 128 → 64.
    Off a GPU 2-CTA clusters (Mosaic's interpreter has none) and in-kernel horizontal taps are
    turned off: they change which CTA loads a weight tile and where the taps are gathered, not a
    single output bit."""
    if jax.default_backend() != "gpu":
        tiles = dataclasses.replace(tiles, cluster_m=False, taps_in_kernel=False)
    tile_n = next(t for t in (tiles.tile_n, 128, 64) if t <= tiles.tile_n and n % t == 0)
    return dataclasses.replace(tiles, tile_n=tile_n, epi_n=min(tiles.epi_n, tile_n))


def quantize_kernel(kernel_thwio: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A (k_t, k_h, k_w, C, N) kernel as `causal_conv` feeds FP8 wgmma: float8_e4m3fn, K-major
    (N, k_t·k_h·k_w·C) with K in (dt, dh, dw, c) order, and its per-output-channel scales (N,)
    float32 (models/fp8.py's weight quantization). Made once for serving (vae_fp8.with_static_scales)
    instead of on every call."""
    w_f8, scale = fp8_lib.quantize_weight(kernel_thwio.reshape(-1, kernel_thwio.shape[-1]))
    return w_f8.T, scale


PrologueOrder = Literal["quantize_first", "pad_first"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fp8Prologue:
    """How an FP8 call builds its input rows: all settings give the same bits (A/B knobs for
    bench/profile_ops.py --fp8-prologue). H200, streaming decode chunk at 480×832: pad_first
    40.5 ms, pad_first packed 39.5, quantize_first unpacked 42.8–43.4 (1-byte moves ran at
    ≈ 1 TB/s), quantize_first packed 36.0 (the default)."""
    # "quantize_first": quantize past and x in their own shape (fused with the norm/SiLU that makes
    # them), then join, pad and stack taps on FP8 bytes; "pad_first": join, pad and flatten in the
    # input dtype, then quantize.
    order: PrologueOrder = "quantize_first"
    barrier: bool = True  # quantize_first: the quantized parts behind an optimization barrier
    packed: bool = True  # move the FP8 bytes as uint32 words (4 channels each), not one by one

    def __post_init__(self):
        if self.order not in get_args(PrologueOrder):
            raise ValueError(f"Fp8Prologue.order must be 'quantize_first' or 'pad_first', got {self.order!r}")


# Named prologues for bench/profile_ops.py --fp8-prologue (_fused: no optimization barrier).
PROLOGUE_PRESETS: dict[str, Fp8Prologue] = {
    "pad_first": Fp8Prologue(order="pad_first", packed=False, barrier=False),
    "pad_first_packed": Fp8Prologue(order="pad_first", barrier=False),
    "quantize_first": Fp8Prologue(packed=False), "quantize_first_fused": Fp8Prologue(packed=False, barrier=False),
    "quantize_first_packed": Fp8Prologue(), "quantize_first_packed_fused": Fp8Prologue(barrier=False),
}


def _pack_words(x: jax.Array) -> jax.Array:
    """(..., C) float8 → (..., C/4) uint32 of the same bytes (zero bytes are FP8 zeros)."""
    return lax.bitcast_convert_type(x.reshape(*x.shape[:-1], x.shape[-1] // 4, 4), jnp.uint32)


def _unpack_words(x: jax.Array) -> jax.Array:
    y = lax.bitcast_convert_type(x, jnp.float8_e4m3fn)
    return y.reshape(*x.shape[:-1], 4 * x.shape[-1])


def causal_conv(x_bthwc: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None = None, *,
                dtype: Any = jnp.bfloat16, x_scale: jax.Array | float | None = None,
                w_fp8: tuple[jax.Array, jax.Array] | None = None,
                tiles: ConvTiles = ConvTiles(), prologue: Fp8Prologue = Fp8Prologue(),
                interpret: Any = None) -> jax.Array:
    """k_t×k_h×k_w conv over past ⧺ x: 'valid' in time, 'same' in space, stride 1, no bias.

    x (B, T, H, W, C); past (B, k_t − 1, H, W, C) or None for k_t = 1; kernel (k_t, k_h, k_w, C, N).
    dtype: bfloat16, or float8_e4m3fn (per-tensor activation scale `x_scale` — a calibrated
    constant when serving, else max|x|/448 of this call — and per-output-channel weight scales;
    `w_fp8`: the kernel already quantized by `quantize_kernel`, else quantized here).
    `prologue`: how FP8 input rows are built (the same bits every way).
    Returns bf16 (B, T, H, W, N). `interpret`: Mosaic GPU interpret params, to run on a CPU.
    """
    b, t, h, w, _ = x_bthwc.shape
    n = kernel_thwio.shape[-1]
    x_rows, wk, plan, out_scale = prepare(x_bthwc, kernel_thwio, past, dtype=dtype, x_scale=x_scale, w_fp8=w_fp8,
                                          tiles=tiles, prologue=prologue, interpret=interpret)
    y = kernel_rows(x_rows, wk, plan, tiles, interpret)
    if out_scale is not None:
        y = (y.astype(jnp.float32) * out_scale).astype(jnp.bfloat16)
    s, s_out = plan.frame, plan.block_out or None
    y = y.reshape(b, t, s_out, n)[:, :, :s] if s_out else y.reshape(b, plan.rows_out, n)[:, :t * s]
    return y.reshape(b, t, s // plan.row, plan.row, n)[:, :, :h, :w]


def prepare(x_bthwc: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None = None, *,
            dtype: Any = jnp.bfloat16, x_scale: jax.Array | float | None = None,
            w_fp8: tuple[jax.Array, jax.Array] | None = None, tiles: ConvTiles = ConvTiles(),
            prologue: Fp8Prologue = Fp8Prologue(), interpret: Any = None) -> tuple[jax.Array, jax.Array, _Plan, jax.Array | None]:
    """`causal_conv`'s checks and operand preparation (padding, tap stacking, quantization): the
    kernel's input rows (B·rows_in, k_w·C; C when the kernel reads the horizontal taps), weights, plan, and the FP8 output scale (N,) (None for
    bf16). `kernel_rows` of the first three is the kernel alone (bench/bench_conv.py times both)."""
    b, t, h, w, c = x_bthwc.shape
    kt, kh, kw, c_in, n = kernel_thwio.shape
    fp8 = jnp.dtype(dtype).itemsize == 1
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float8_e4m3fn)):
        raise ValueError(f"dtype must be bfloat16 or float8_e4m3fn, got {jnp.dtype(dtype)}")
    if c_in != c or kh % 2 == 0 or kw % 2 == 0:
        raise ValueError(f"kernel {kernel_thwio.shape} does not fit input {x_bthwc.shape} (odd k_h, k_w)")
    if (kt == 1) != (past is None) or (past is not None and past.shape != (b, kt - 1, h, w, c)):
        raise ValueError(f"past must be (B, k_t-1, H, W, C) = {(b, kt - 1, h, w, c)} (None when k_t = 1), "
                         f"got {None if past is None else past.shape}")
    if (kw * c) % tiles.tile_k(dtype) or n % tiles.tile_n or tiles.tile_n % tiles.epi_n:
        raise ValueError(f"k_w·C = {kw * c} must be a multiple of {tiles.tile_k(dtype)} and N = {n} of "
                         f"tile_n = {tiles.tile_n} (a multiple of epi_n = {tiles.epi_n})")
    if tiles.order not in ("rows", "frames"):
        raise ValueError(f"tiles.order must be 'rows' or 'frames', got {tiles.order!r}")
    hp, wp = h + kh - 1, -(-(w + kw - 1) // 8) * 8  # row pitch a multiple of 8 (module docstring)
    s = hp * wp
    if tiles.order == "frames":  # each output frame padded to whole tiles (its last tile reads into
        # the next frame; those outputs are sliced off)
        s_out = -(-s // tiles.m_unit) * tiles.m_unit
        rows_out, last_in = t * s_out, (t - 1) * s + s_out
        plan_blocks = dict(blocks=t, block_in=s, block_out=s_out)
    else:
        rows_out = last_in = -(-t * s // tiles.m_unit) * tiles.m_unit
        plan_blocks = {}
    rows_in = last_in + (kt - 1) * s + (kh - 1) * wp  # the last tap's rows
    # channels off whole 128-byte steps keep the stacked taps: the same bits
    in_kernel = tiles.taps_in_kernel and kw > 1 and c % tiles.tile_k(dtype) == 0
    # each batch item's rows: + k_w − 1 for the last A tile's shift
    plan = _Plan(b, (kt, kh), s, wp, rows_in + (kw - 1 if in_kernel else 0), rows_out, **plan_blocks,
                 kw=kw if in_kernel else 1)

    if w_fp8 is not None and (not fp8 or w_fp8[0].shape != (n, kt * kh * kw * c) or w_fp8[1].shape != (n,)
                              or w_fp8[0].dtype != jnp.float8_e4m3fn):
        raise ValueError(f"w_fp8 must be quantize_kernel's ((N, K), (N,)) = ({(n, kt * kh * kw * c)}, {(n,)}) "
                         f"with dtype float8_e4m3fn, got {None if w_fp8 is None else (w_fp8[0].shape, w_fp8[1].shape)}")
    parts = [x_bthwc] if past is None else [past, x_bthwc]
    packed = fp8 and prologue.packed and c % 4 == 0
    if fp8:  # the DiT's FP8 scaling (models/fp8.py): saturating at ±448, per-output-channel weights
        sx = (fp8_lib.amax_scale(functools.reduce(jnp.maximum, [jnp.max(jnp.abs(p.astype(jnp.float32))) for p in parts]))
              if x_scale is None else jnp.asarray(x_scale, jnp.float32))
        if prologue.order == "pad_first":
            parts = [p.astype(x_bthwc.dtype) for p in parts]
        else:  # quantized before padding (zeros stay zeros): the rest moves bytes
            parts = [fp8_lib.to_fp8(p, sx) for p in parts]
            parts = [_pack_words(p) for p in parts] if packed else parts
            parts = list(lax.optimization_barrier(parts)) if prologue.barrier else parts
        wk, sw = quantize_kernel(kernel_thwio) if w_fp8 is None else w_fp8
        wk = wk if interpret is None else wk.T  # see kernel_rows
    else:
        parts = [p.astype(dtype) for p in parts]
        wk = kernel_thwio.reshape(kt * kh * kw * c, n).astype(dtype)  # K order (dt, dh, dw, c): taps, stacked channels
    xx = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    xx = jnp.pad(xx, ((0, 0), (0, 0), (kh // 2, kh // 2), (kw // 2, wp - w - kw // 2), (0, 0)))
    xx = xx.reshape(b, (t + kt - 1) * s, xx.shape[-1])
    xx = jnp.pad(xx, ((0, 0), (0, rows_in + kw - 1 - xx.shape[1]), (0, 0)))
    if fp8 and prologue.order == "pad_first":
        xx = fp8_lib.to_fp8(xx, sx)
        xx = _pack_words(xx) if packed else xx
    if in_kernel:  # not stacked: the kernel reads the horizontal taps as row shifts
        x_rows = xx
    else:
        x_rows = jnp.concatenate([xx[:, i:i + rows_in] for i in range(kw)], axis=-1)  # horizontal taps
    x_rows = _unpack_words(x_rows) if packed else x_rows
    return x_rows.reshape(b * plan.rows_in, x_rows.shape[-1]), wk, plan, (sx * sw if fp8 else None)


def causal_conv_reference(x_bthwc: jax.Array, kernel_thwio: jax.Array, past: jax.Array | None = None, *,
                          dtype: Any = jnp.float32, x_scale: jax.Array | float | None = None) -> jax.Array:
    """The same conv with XLA in float32 after the same operand rounding as `causal_conv` (bf16, or
    FP8 with its scales): the oracle for the kernel's numerics, runnable anywhere."""
    xx = x_bthwc if past is None else jnp.concatenate([past, x_bthwc], axis=1)
    xx, kk = xx.astype(jnp.float32), kernel_thwio.astype(jnp.float32)
    if jnp.dtype(dtype).itemsize == 1:
        sx = fp8_lib.amax_scale(jnp.max(jnp.abs(xx))) if x_scale is None else jnp.asarray(x_scale, jnp.float32)
        # The barrier keeps the FP8 values: on a GPU, XLA (allowing excess precision) otherwise drops
        # the f32→f8→f32 round trip and this oracle quietly becomes the exact conv.
        x_f8, (w_f8, sw) = lax.optimization_barrier(
            (fp8_lib.to_fp8(xx, sx), fp8_lib.quantize_weight(kk.reshape(-1, kk.shape[-1]))))
        xx = x_f8.astype(jnp.float32) * sx
        kk = (w_f8.astype(jnp.float32) * sw).reshape(kk.shape)
    elif jnp.dtype(dtype) != jnp.dtype(jnp.float32):
        xx, kk = xx.astype(dtype).astype(jnp.float32), kk.astype(dtype).astype(jnp.float32)
    kh, kw = kernel_thwio.shape[1:3]
    return lax.conv_general_dilated(xx, kk, (1, 1, 1), ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)),
                                    dimension_numbers=("NDHWC", "DHWIO", "NDHWC"), precision="highest")

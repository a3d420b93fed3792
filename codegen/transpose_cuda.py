"""Render a pointwise program whose tensors disagree on their innermost dim as a tiled
kernel: tiles staged through shared memory (Note [Transpose tiles]).

Note [Transpose tiles]: the planner picks two loop dims: A, along which the outputs are
contiguous, and B, along which the inputs that disagree with them are (schedulers/transpose.py).
A block takes tiles of TA x TB elements (A x B) of the collapsed loop, one outer index each:
every gridDim-th, `stages` - 1 tiles copied ahead, or one where the grid has a block a tile
(the default; transpose.tiles_each). Each tensor is read or written in one of three ways:

- `tile`: contiguous along B. An input's tile is copied to shared memory in chunks of V
  elements along B (cp.async, `stages` tiles in flight per block); an output's is written
  there and copied out along B after a barrier.
- `vec`: contiguous along A: read or written straight from registers, V elements along A.
- `elem`: anything else (broadcasts, other strides): one element at a time.

The fusion's statements run on V x V blocks: a thread reads V chunks (rows r0..r0+V-1, chunk
c) of each staged tile, so it holds V elements along A for each of V columns, and stores V
vectors along A. In shared memory a tile is TA rows of TB/V chunks, and chunk c of row r
sits at chunk c ^ key(r) of its row (a swizzle; `SmemTile`), so that neither the copies
(consecutive threads on consecutive chunks of one row) nor the blocks (consecutive threads
on rows V apart, one chunk) make two threads of one shared-memory wavefront meet in a bank;
tests/test_transpose_schedule.py checks that for every layout the planner makes.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cuda_ops import ELEMENT_BYTES, MEMORY_TYPE, RANDOM_STMTS, prelude_features, random_setup
from .kernel_ir import PointwiseProgram
from .prelude import prelude_source
from .stmt_cuda import render_stmt, scalar_arg_types, scalar_params, to_memory

KERNEL_NAME = "fc_transpose"


@dataclass(frozen=True)
class SmemTile:
    """One tensor's tile in shared memory: `tile_a` rows of `tile_b // vec` chunks of `vec`
    elements (one access of `width` bytes each), chunk c of row r at chunk c ^ key(r)."""

    vec: int
    elem_bytes: int
    tile_a: int
    tile_b: int

    @property
    def width(self) -> int:
        return self.vec * self.elem_bytes

    @property
    def lanes(self) -> int:
        """Threads of one shared-memory wavefront: 128 bytes of accesses of at least a word."""
        return 128 // max(self.width, 4)

    @property
    def spread(self) -> int:
        """Chunks sharing a 4-byte word (chunks under a word: 16-bit values one at a time)."""
        return max(self.width, 4) // self.width

    @property
    def chunks(self) -> int:
        return self.tile_b // self.vec

    @property
    def nbytes(self) -> int:
        return self.tile_a * self.tile_b * self.elem_bytes

    def key(self, row: int) -> int:
        return ((row // self.vec) % self.lanes) * self.spread

    def offset(self, row: int, chunk: int) -> int:
        """Byte offset of chunk `chunk` of row `row`."""
        return (row * self.chunks + (chunk ^ self.key(row))) * self.width

    def unfit(self) -> str | None:
        """Why this tile cannot be swizzled without conflicts, or None."""
        if self.chunks % (self.lanes * self.spread):
            return (f"a row of {self.tile_b} elements is {self.chunks} chunks, not a multiple "
                    f"of {self.lanes * self.spread}")  # fmt: skip
        if self.tile_a // self.vec < self.lanes:
            return f"{self.tile_a} rows are fewer than {self.lanes} blocks of {self.vec}"
        return None


def copy_slot(slot: int, chunks: int) -> tuple[int, int]:
    """(row, chunk) that thread slot `slot` copies in or out (consecutive slots, one row)."""
    return slot // chunks, slot % chunks


def block_slot(slot: int, tile_a: int, vec: int) -> tuple[int, int]:
    """(first row, chunk) of the V x V block that thread slot `slot` computes (consecutive
    slots: blocks V rows apart, one chunk)."""
    return (slot % (tile_a // vec)) * vec, slot // (tile_a // vec)


@dataclass(frozen=True)
class TransposeVariant:
    rank: int  # collapsed loop rank (>= 2)
    dim_a: int  # the loop dim the outputs run along
    dim_b: int  # the loop dim the staged tiles run along
    vec: int
    tile_a: int
    tile_b: int
    threads: int
    stages: int  # tiles of staged inputs in shared memory per block (cp.async); 0: copies
    # go through registers into one buffer
    index_type: str  # 'int' or 'long long'
    load_modes: tuple[str, ...]  # per access: 'tile', 'vec' or 'elem'
    store_modes: tuple[str, ...]  # per store: 'tile', 'vec' or 'elem'
    live_dims: tuple[tuple[bool, ...], ...]  # per access then per store: stride != 0 per dim
    load_hint: int = 0  # Note [Cache hints] (prelude/core.cuh)
    store_hint: int = 0
    min_blocks: int = 1  # __launch_bounds__ minimum: the blocks an SM the grid counts on

    def describe(self) -> str:
        return (f"transpose: rank={self.rank} A=dim{self.dim_a} B=dim{self.dim_b} "
                f"tile={self.tile_a}x{self.tile_b} vec={self.vec} threads={self.threads} "
                f"stages={self.stages} blocks/SM={self.min_blocks} index={self.index_type} "
                f"loads={','.join(self.load_modes)} stores={','.join(self.store_modes)}")  # fmt: skip

    def tile_of(self, dtype) -> SmemTile:
        return SmemTile(self.vec, ELEMENT_BYTES[dtype], self.tile_a, self.tile_b)

    def smem_layout(self, program: PointwiseProgram) -> tuple[list[int], list[int], int]:
        """(offset of each access's tiles, of each store's tile, total bytes); -1 where
        the tensor has none."""
        at = 0
        loads, stores = [], []
        for acc, mode in zip(program.accesses, self.load_modes):
            loads.append(at if mode == "tile" else -1)
            if mode == "tile":
                at += max(self.stages, 1) * self.tile_of(acc.dtype).nbytes
        for st, mode in zip(program.stores, self.store_modes):
            stores.append(at if mode == "tile" else -1)
            if mode == "tile":
                at += self.tile_of(st.dtype).nbytes
        return loads, stores, at


def arg_types(program: PointwiseProgram, variant: TransposeVariant) -> tuple[str, ...]:
    idx = "i32" if variant.index_type == "int" else "i64"
    per_tensor = ("ptr",) + (idx,) * variant.rank
    lin = (idx,) * variant.rank if numbers_elements(program) else ()
    return (per_tensor * (len(program.accesses) + len(program.stores))
            + (idx,) * (variant.rank + 1) + lin + scalar_arg_types(program))  # fmt: skip


def numbers_elements(program: PointwiseProgram) -> bool:
    """Whether the statements read each element's linear index (random numbers, Note
    [Philox numbers]): the kernel then takes the loop's row-major strides too."""
    return any(s.op in RANDOM_STMTS for s in program.stmts)


def render_transpose(program: PointwiseProgram, variant: TransposeVariant) -> str:
    v = variant
    R, A, B, T = v.rank, v.dim_a, v.dim_b, v.threads
    n_acc = len(program.accesses)
    tensors = [("a", i, acc.dtype) for i, acc in enumerate(program.accesses)]
    tensors += [("o", i, st.dtype) for i, st in enumerate(program.stores)]
    modes = list(v.load_modes) + list(v.store_modes)
    load_off, store_off, _ = v.smem_layout(program)
    offsets = load_off + store_off
    chunks = v.tile_b // v.vec
    blocks = (v.tile_a // v.vec) * chunks  # V x V blocks of a tile
    staged = [k for k in range(n_acc) if modes[k] == "tile"]
    through = [k for k in range(n_acc, len(tensors)) if modes[k] == "tile"]
    stages = max(v.stages, 1)

    # the loop is the outputs' shape in row-major order; element (r0 + r, c * V + j) of
    # the tile is number lin0 + ... of it, as the pointwise kernel numbers it
    define, caches = random_setup(program.stmts, f"lin0 + (idx_t)(r0 + r) * lin_s{A} + "
                                                 f"(idx_t)(c * FC_V + j) * lin_s{B}")  # fmt: skip
    features = prelude_features(program.stmts, program.stores)
    L: list[str] = [prelude_source("core", "math", "tile", *features), *define, f"#define FC_V {v.vec}",
                    f"#define FC_TA {v.tile_a}", f"#define FC_TB {v.tile_b}",
                    f"#define FC_THREADS {T}", f"#define FC_STAGES {stages}", ""]  # fmt: skip
    params: list[str] = []
    for prefix, i, dtype in tensors:
        const = "const " if prefix == "a" else ""
        params.append(f"{const}{MEMORY_TYPE[dtype]}* __restrict__ {prefix}{i}")
        params += [f"idx_t {prefix}{i}_s{d}" for d in range(R)]
    params += [f"idx_t n{d}" for d in range(R)] + ["idx_t ntiles"]
    lin = numbers_elements(program)
    params += [f"idx_t lin_s{d}" for d in range(R)] if lin else []
    params += scalar_params(program)
    L.append(f"typedef {v.index_type} idx_t;")
    L.append(f'extern "C" __global__ void __launch_bounds__({T}, {v.min_blocks}) {KERNEL_NAME}(')
    L.append("    " + ",\n    ".join(params) + ") {")
    L.append("  extern __shared__ __align__(16) unsigned char fc_smem[];")
    L.extend("  " + c for c in caches)
    L.append(f"  const idx_t tiles_a = (n{A} + FC_TA - 1) / FC_TA;")
    L.append(f"  const idx_t tiles_b = (n{B} + FC_TB - 1) / FC_TB;")

    # tile t's origin along A and B, and each tensor's offset at it
    nt = len(tensors) + lin  # and the tile's first element number, where random numbers need it
    L.append(f"  auto origin = [&](idx_t t, idx_t& at, idx_t& bt, idx_t (&base)[{nt}]) {{")
    L.append("    idx_t rem = t;")
    L.append("    at = (rem % tiles_a) * FC_TA; rem /= tiles_a;")
    L.append("    bt = (rem % tiles_b) * FC_TB; rem /= tiles_b;")
    outer = [d for d in range(R) if d not in (A, B)]
    for d in reversed(outer):
        last = d == outer[0]
        L.append(f"    const idx_t c{d} = " + ("rem;" if last else f"rem % n{d}; rem /= n{d};"))
    for k, (prefix, i, _) in enumerate(tensors):
        live = v.live_dims[k]
        terms = [f"at * {prefix}{i}_s{A}"] if live[A] else []
        terms += [f"bt * {prefix}{i}_s{B}"] if live[B] else []
        terms += [f"c{d} * {prefix}{i}_s{d}" for d in outer if live[d]]
        L.append(f"    base[{k}] = {' + '.join(terms) or '0'};")
    if lin:
        terms = [f"at * lin_s{A}", f"bt * lin_s{B}"] + [f"c{d} * lin_s{d}" for d in outer]
        L.append(f"    base[{nt - 1}] = {' + '.join(terms)};")
    L.append("  };")

    def tile_chunk(k: int, dtype, stage: str, row: str, chunk: str, key: str) -> str:
        tile = v.tile_of(dtype)
        at = f"{offsets[k]} + {stage} * {tile.nbytes} + " if stage != "0" else f"{offsets[k]} + "
        return f"fc_smem + {at}(({row}) * {chunks} + (({chunk}) ^ ({key}))) * {tile.width}"

    def swizzle(dtype, row: str) -> str:
        tile = v.tile_of(dtype)
        return f"((({row}) / FC_V) % {tile.lanes}) * {tile.spread}"

    def slots(total: str, count: int, body: list[str], indent: str) -> list[str]:
        iters = -(-count // T)
        out = ["#pragma unroll", f"for (int u = 0; u < {iters}; ++u) {{",
               "  const int l = threadIdx.x + u * FC_THREADS;"]  # fmt: skip
        if iters * T != count:
            out.append(f"  if (l >= {total}) break;")
        out += ["  " + line for line in body] + ["}"]
        return [indent + line for line in out]

    copies = "sync" if v.stages == 0 else "async"
    if staged:
        L.append("  // the staged inputs of tile t into stage `stage`: chunks of V along B")
        L.append("  auto copy_in = [&](idx_t t, int stage) {")
        L.append(f"    idx_t at, bt, base[{nt}];")
        L.append("    origin(t, at, bt, base);")
        body = [f"const int r = l / {chunks}, c = l % {chunks};",
                f"const bool ok = at + r < n{A} && bt + c * FC_V < n{B};"]  # fmt: skip
        for k in staged:
            dt = tensors[k][2]
            mt, width = MEMORY_TYPE[dt], v.tile_of(dt).width
            src = f"a{k} + (ok ? base[{k}] + (idx_t)r * a{k}_s{A} + c * FC_V : 0)"
            dst = tile_chunk(k, dt, "stage", "r", "c", swizzle(dt, "r"))
            if copies == "async":
                body.append(f"fc_cp_async<{width}>({dst}, {src}, ok);")
            else:
                body.append(f"if (ok) fc_smem_put<FC_V, {mt}>({dst}, "
                            f"fc_load_vec_hint<FC_V, {v.load_hint}>({src}));")  # fmt: skip
        L += slots(f"FC_TA * {chunks}", v.tile_a * chunks, body, "    ")
        L.append("  };")
        if copies == "async":
            L.append("  // Note [Transpose tiles]: FC_STAGES - 1 tiles in flight ahead of the one computed")
            L.append("#pragma unroll")
            L.append("  for (int s = 0; s + 1 < FC_STAGES; ++s) {")
            L.append("    const idx_t t = blockIdx.x + (idx_t)s * gridDim.x;")
            L.append("    if (t < ntiles) copy_in(t, s);")
            L.append("    fc_cp_async_commit_group();")
            L.append("  }")
    L.append("  int stage = 0;")
    L.append("  for (idx_t t = blockIdx.x; t < ntiles; t += gridDim.x) {")
    if staged and copies == "async":
        L.append("    const idx_t ahead = t + (idx_t)(FC_STAGES - 1) * gridDim.x;")
        L.append("    if (ahead < ntiles) copy_in(ahead, (stage + FC_STAGES - 1) % FC_STAGES);")
        L.append("    fc_cp_async_commit_group();")
    elif staged:
        L.append("    copy_in(t, 0);")
    L.append(f"    idx_t at, bt, base[{nt}];")
    L.append("    origin(t, at, bt, base);")
    if lin:
        L.append(f"    const idx_t lin0 = base[{nt - 1}];")
    # the inputs read along A go to registers before the wait for this tile's copies, so
    # their loads are in flight beside them; where a thread computes several blocks (values
    # one at a time) they load block by block, as all of them at once spilled
    hoisted = -(-blocks // T) == 1
    if hoisted:
        L += _direct_loads(program, v, blocks)
    if staged and copies == "async":
        L.append("    fc_cp_async_wait_groups<FC_STAGES - 1>();")
    if staged:
        L.append("    __syncthreads();")
    L += slots(str(blocks), blocks, _block_body(program, v, tensors, modes, tile_chunk, swizzle,
                                                hoisted), "    ")  # fmt: skip
    if through:
        L.append("    __syncthreads();  // the output tiles are written")
        body = [f"const int r = l / {chunks}, c = l % {chunks};",
                f"if (at + r >= n{A} || bt + c * FC_V >= n{B}) continue;"]  # fmt: skip
        for k in through:
            prefix, i, dt = tensors[k]
            mt = MEMORY_TYPE[dt]
            src = tile_chunk(k, dt, "0", "r", "c", swizzle(dt, "r"))
            body.append(f"fc_store_vec_hint<FC_V, {v.store_hint}>(o{i} + base[{k}] + (idx_t)r * "
                        f"o{i}_s{A} + c * FC_V, fc_smem_get<FC_V, {mt}>({src}));")  # fmt: skip
        L += slots(f"FC_TA * {chunks}", v.tile_a * chunks, body, "    ")
    if staged or through:
        L.append("    __syncthreads();  // before the next tile overwrites this one's buffers")
    L.append("    stage = stage + 1 == FC_STAGES ? 0 : stage + 1;")
    L.append("  }")
    L.append("}")
    return "\n".join(L) + "\n"


def _direct_loads(program: PointwiseProgram, v: TransposeVariant, blocks: int) -> list[str]:
    """The V x V values of each input read along A for the thread's block, ahead: V vectors
    along A, one a column (a{i}_v[j])."""
    A, B = v.dim_a, v.dim_b
    out = ["    const int l = threadIdx.x;",
           "    const int r0 = (l % (FC_TA / FC_V)) * FC_V, c = l / (FC_TA / FC_V);",
           f"    const bool ok = l < {blocks} && at + r0 < n{A} && bt + c * FC_V < n{B};"]  # fmt: skip
    out = ["    {"] + ["  " + x for x in out]
    ins = [i for i in range(len(program.accesses)) if v.load_modes[i] == "vec"]
    decls = [f"    fc_vec<{MEMORY_TYPE[program.accesses[i].dtype]}, FC_V> a{i}_v[FC_V];"
             for i in ins]  # fmt: skip
    for i in ins:
        col = f"(idx_t)(c * FC_V + j) * a{i}_s{B}" if v.live_dims[i][B] else "0"
        out += ["#pragma unroll",
                f"      for (int j = 0; j < FC_V; ++j) a{i}_v[j] = fc_load_vec_if<FC_V, "
                f"{v.load_hint}>(a{i} + (ok ? base[{i}] + r0 + {col} : 0), ok);"]  # fmt: skip
    return decls + out + ["    }"] if ins else []


def _block_body(program: PointwiseProgram, v: TransposeVariant, tensors: list, modes: list,
                tile_chunk, swizzle, hoisted: bool) -> list[str]:  # fmt: skip
    """The statements of one V x V block: rows r0.., chunk c of the tile."""
    A, B = v.dim_a, v.dim_b
    n_acc = len(program.accesses)
    body = ["const int r0 = (l % (FC_TA / FC_V)) * FC_V, c = l / (FC_TA / FC_V);",
            f"if (at + r0 >= n{A} || bt + c * FC_V >= n{B}) continue;"]  # fmt: skip
    keys: dict[str, str] = {}
    for k, (_, _, dt) in enumerate(tensors):
        if modes[k] != "tile":
            continue
        key = swizzle(dt, "r0")
        if key not in keys:
            keys[key] = f"key{len(keys)}"
            body.append(f"const int {keys[key]} = {key};")
    for k in range(n_acc):
        prefix, i, dt = tensors[k]
        mt = MEMORY_TYPE[dt]
        if modes[k] == "tile":
            src = tile_chunk(k, dt, "stage", "r0 + r", "c", keys[swizzle(dt, "r0")])
            body += [f"fc_vec<{mt}, FC_V> a{i}_t[FC_V];", "#pragma unroll",
                     f"for (int r = 0; r < FC_V; ++r) a{i}_t[r] = fc_smem_get<FC_V, {mt}>({src});"]
        elif modes[k] == "vec" and not hoisted:  # else loaded before the wait (_direct_loads)
            col = f"(idx_t)(c * FC_V + j) * a{i}_s{B}" if v.live_dims[k][B] else "0"
            body += [f"fc_vec<{mt}, FC_V> a{i}_v[FC_V];", "#pragma unroll",
                     f"for (int j = 0; j < FC_V; ++j) a{i}_v[j] = fc_load_vec_hint<FC_V, "
                     f"{v.load_hint}>(a{i} + base[{k}] + r0 + {col});"]  # fmt: skip
    for k in range(n_acc, len(tensors)):
        prefix, i, dt = tensors[k]
        if modes[k] == "tile":
            body.append(f"fc_vec<{MEMORY_TYPE[dt]}, FC_V> o{i}_t[FC_V];")

    def elem(k: int, prefix: str, i: int) -> str:
        live = v.live_dims[k]
        terms = [f"base[{k}]"]
        terms += [f"(idx_t)(r0 + r) * {prefix}{i}_s{A}"] if live[A] else []
        terms += [f"(idx_t)(c * FC_V + j) * {prefix}{i}_s{B}"] if live[B] else []
        return " + ".join(terms)

    def load(i: int) -> str:
        mode = modes[i]
        if mode == "tile":
            return f"a{i}_t[r][j]"
        if mode == "vec":
            return f"a{i}_v[j][r]"
        return f"fc_ldg(a{i} + {elem(i, 'a', i)})"

    dtypes = {s.var: s.dtype for s in program.stmts}
    inner = [render_stmt(s, dtypes, load) for s in program.stmts]
    vec_outs = []
    for n, st in enumerate(program.stores):
        k = n_acc + n
        value = to_memory(st.var, st.dtype)
        if modes[k] == "vec":
            inner.append(f"o{n}_v[r] = {value};")
            vec_outs.append(n)
        elif modes[k] == "tile":
            inner.append(f"o{n}_t[r][j] = {value};")
        else:
            inner.append(f"o{n}[{elem(k, 'o', n)}] = {value};")
    body += ["#pragma unroll", "for (int j = 0; j < FC_V; ++j) {"]
    body += [f"  fc_vec<{MEMORY_TYPE[program.stores[n].dtype]}, FC_V> o{n}_v;" for n in vec_outs]
    body += ["#pragma unroll", "  for (int r = 0; r < FC_V; ++r) {"]
    body += ["    " + line for line in inner] + ["  }"]
    for n in vec_outs:
        k = n_acc + n
        col = f"(idx_t)(c * FC_V + j) * o{n}_s{B}" if v.live_dims[k][B] else "0"
        body.append(f"  fc_store_vec_hint<FC_V, {v.store_hint}>(o{n} + base[{k}] + r0 + {col}, o{n}_v);")
    body.append("}")
    for n, st in enumerate(program.stores):
        k = n_acc + n
        if modes[k] == "tile":
            dst = tile_chunk(k, st.dtype, "0", "r0 + r", "c", keys[swizzle(st.dtype, "r0")])
            body += ["#pragma unroll", f"for (int r = 0; r < FC_V; ++r) "
                     f"fc_smem_put<FC_V, {MEMORY_TYPE[st.dtype]}>({dst}, o{n}_t[r]);"]  # fmt: skip
    return body

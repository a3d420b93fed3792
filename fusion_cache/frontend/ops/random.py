"""Random numbers: uniform, normal, rand_like, randn_like (nvFuser's arguments). Counter-based
(Note [Philox numbers] in fusion_cache/ir/interpret/random.py): an explicit rng_seed and
rng_offset fix the numbers; without them each execute draws from torch's generator (Note
[Random seeds] in fusion_cache/ir/random_seeds.py)."""
from __future__ import annotations

from .. import shapes
from ..dtypes import DataType, check_dtype, is_float
from ..records import Record
from ..values import TensorInfo
from .base import OpsBase

_SEED_DTYPES = (DataType.Int, DataType.Int32, DataType.UInt64)


class RandomOps(OpsBase):
    def _distribution(self, op: str, names: tuple[str, str], a, b, shape, rng_seed, rng_offset,
                      dtype):  # fmt: skip
        ra, rb = self._ref(a, op, names[0], "S"), self._ref(b, op, names[1], "S")
        sizes = self._size_list(shape, op, "shape")
        if (rng_seed is None) != (rng_offset is None):
            raise TypeError(f"{op}: rng_seed and rng_offset must be given together")
        seed = None if rng_seed is None else self._ref(rng_seed, op, "rng_seed", "S")
        offset = None if rng_offset is None else self._ref(rng_offset, op, "rng_offset", "S")
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            if not is_float(dt):
                raise TypeError(f"{op}: random numbers are floating point, got dtype {dt!r}")
            for ref, name in ((ra, names[0]), (rb, names[1])):
                if not is_float(self._info(ref).dtype) and self._info(ref).dtype not in (
                        DataType.Int, DataType.Int32):  # fmt: skip
                    raise TypeError(f"{op}: {name} must be a real number, got "
                                    f"{self._info(ref).dtype!r}")  # fmt: skip
            for ref, name in ((seed, "rng_seed"), (offset, "rng_offset")):
                if ref is not None and self._info(ref).dtype not in _SEED_DTYPES:
                    raise TypeError(f"{op}: {name} must be an integer scalar, got "
                                    f"{self._info(ref).dtype!r}")  # fmt: skip
            target = self._static_sizes(sizes)
            if any(t is not None and t < 0 for t in target):
                raise ValueError(f"{op}: shape {target} has a negative size")
            return [TensorInfo(dt, tuple(shapes.SYMBOLIC if t is None else t for t in target))]

        kwargs = (("rng_seed", seed), ("rng_offset", offset), ("dtype", dt))
        return self._apply(Record("op", op, (ra, rb, sizes), kwargs, self._out("T")), infer)

    def uniform(self, minval, maxval, shape, *, rng_seed=None, rng_offset=None,
                dtype=DataType.Float):  # fmt: skip
        """Numbers uniform in [minval, maxval)."""
        return self._distribution("uniform", ("minval", "maxval"), minval, maxval, shape,
                                  rng_seed, rng_offset, dtype)  # fmt: skip

    def normal(self, mean, std, shape, *, rng_seed=None, rng_offset=None, dtype=DataType.Float):
        """Numbers normal with this mean and standard deviation."""
        return self._distribution("normal", ("mean", "std"), mean, std, shape, rng_seed,
                                  rng_offset, dtype)  # fmt: skip

    def _like(self, op: str, arg):
        x = self._tensor(arg, op)

        def infer() -> list:
            info = self._info(x)
            if not is_float(info.dtype):
                raise TypeError(f"{op}: arg must be floating point, got {info.dtype!r}")
            return [TensorInfo(info.dtype, info.shape)]

        return self._apply(Record("op", op, (x,), (), self._out("T")), infer)

    def rand_like(self, arg):
        """Uniform numbers in [0, 1) of arg's shape and dtype."""
        return self._like("rand_like", arg)

    def randn_like(self, arg):
        """Standard normal numbers of arg's shape and dtype."""
        return self._like("randn_like", arg)

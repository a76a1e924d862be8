"""Data pipeline: Megatron-format token datasets, GPT samples and a prefetching loader.

    import tardelli as td
    train, valid, test = td.data.build_gpt_datasets("corpus", seq_len=256, seed=1234)
    loader = td.data.DataLoader(train, micro_batch=8)
    x, y = loader.next()          # int64 [8, 256] inputs and next-token targets

Files are byte-compatible with Megatron-LM's MMapIndexedDataset (PREFIX.bin + PREFIX.idx);
`python -m tardelli.data.preprocess` writes them from text or JSONL. The work is done in C++
(tardelli._C.data); this module adds Python conveniences only.
"""
from .._C import data as _Cd

IndexedDatasetBuilder = _Cd.IndexedDatasetBuilder
GPTDataset = _Cd.GPTDataset
split_documents = _Cd.split_documents
dtype_code_size = _Cd.dtype_code_size
dtype_code_name = _Cd.dtype_code_name
best_dtype_code = _Cd.IndexedDatasetBuilder.best_dtype_code

# Megatron's DType codes.
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
               "float32": 7, "uint16": 8}


class IndexedDataset(_Cd.IndexedDataset):
    """PREFIX.bin/.idx opened read-only (mmap); ds[i] is sequence i as an int64 tensor."""

    def __getitem__(self, i):
        n = len(self)
        if not isinstance(i, int):
            i = i.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"IndexedDataset index {i} out of range for {n} sequences")
        return self.get(i)

    def __iter__(self):
        for i in range(len(self)):
            yield self.get(i)

    def __repr__(self):
        return (f"IndexedDataset({self.prefix!r}, sequences={len(self)}, "
                f"documents={self.num_documents}, tokens={self.num_tokens}, "
                f"dtype={dtype_code_name(self.dtype_code)})")


class DataLoader:
    """Micro-batches of a GPTDataset in Megatron's pretraining-sampler order, prepared by a
    background C++ thread. next() returns (x, y): int64 [micro_batch, seq_len] inputs and the
    targets (inputs shifted by one token). Iterating never ends (epochs are unbounded).

    consumed_samples is the global sample count after the batches returned so far: store it in a
    checkpoint and pass it back to resume exactly."""

    def __init__(self, dataset, micro_batch, dp_rank=0, dp_size=1, consumed_samples=0,
                 prefetch=2):
        self._loader = _Cd.DataLoader(dataset, micro_batch, dp_rank, dp_size, consumed_samples,
                                      prefetch)
        self.dataset = dataset

    def next_batch(self):
        """The raw int64 [micro_batch, seq_len + 1] batch."""
        return self._loader.next()

    def next(self):
        b = self._loader.next()
        n = b.shape[1] - 1
        return b.narrow(1, 0, n).contiguous(), b.narrow(1, 1, n).contiguous()

    __next__ = next

    def __iter__(self):
        return self

    @property
    def consumed_samples(self):
        return self._loader.consumed_samples

    @property
    def micro_batch(self):
        return self._loader.micro_batch

    @property
    def global_batch(self):
        return self._loader.global_batch


def build_gpt_datasets(prefix, seq_len, seed, split=(98, 1, 1)):
    """(train, valid, test) GPTDatasets over PREFIX, its documents split by Megatron's rule;
    None for an empty split. A split whose documents are too short for one sample raises."""
    ds = prefix if isinstance(prefix, _Cd.IndexedDataset) else IndexedDataset(prefix)
    out = []
    for begin, end in split_documents(ds.num_documents, list(split)):
        out.append(GPTDataset(ds, begin, end, seq_len, seed) if end > begin else None)
    return tuple(out)


__all__ = ["IndexedDataset", "IndexedDatasetBuilder", "GPTDataset", "DataLoader",
           "split_documents", "build_gpt_datasets", "best_dtype_code", "dtype_code_size",
           "dtype_code_name", "DTYPE_CODES"]

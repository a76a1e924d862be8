#pragma once
// CRC-32 as zlib, PNG, gzip and zip compute it (reflected polynomial 0xEDB88320, initial value
// and final xor 0xFFFFFFFF): crc32("123456789") == 0xCBF43926. Checkpoint manifests record one
// per file so a reader can tell a damaged file from a good one before trusting its bytes.
#include <cstddef>
#include <cstdint>
#include <string>

namespace td::checkpoint {

// The CRC of data[0..n), continuing from `crc` (the CRC of the bytes before, 0 to start), so
// crc32(b, nb, crc32(a, na)) == crc32(a ++ b). Computed by zlib.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// The CRC and size of a whole file (read in 1 MiB chunks); td::Error naming the file when it
// cannot be read.
struct FileDigest {
  uint64_t size = 0;
  uint32_t crc32 = 0;
};
FileDigest crc32_file(const std::string& path);

}  // namespace td::checkpoint

#include "tardelli/checkpoint/crc32.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "tardelli/core/error.h"

namespace td::checkpoint {

namespace {

// Note [Slicing-by-8]: table[0] is the classic byte-at-a-time table; table[k][b] is the CRC of
// byte b followed by k zero bytes, so eight input bytes fold into the CRC with eight independent
// lookups instead of a chain of eight dependent ones (Intel's slicing-by-8, as in zlib's
// braided CRC). Results are identical to the bytewise loop.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b)
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;  // little-endian loads (the host is little-endian; see safetensors.cpp)
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
        kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

FileDigest crc32_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TD_CHECK(fd >= 0, "checkpoint: cannot open '", path, "': ", std::strerror(errno));
  FileDigest d;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      TD_ERROR("checkpoint: cannot read '", path, "': ", err);
    }
    if (r == 0) break;
    d.crc32 = crc32(buf.data(), static_cast<size_t>(r), d.crc32);
    d.size += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return d;
}

}  // namespace td::checkpoint

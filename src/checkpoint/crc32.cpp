#include "tardelli/checkpoint/crc32.h"

#include <fcntl.h>
#include <unistd.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "tardelli/core/error.h"

namespace td::checkpoint {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  // zlib's CRC-32 (the same polynomial and conventions, and a continuation from `crc`); its
  // length argument is 32-bit, so long buffers go in chunks.
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const auto len = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    c = ::crc32(c, p, len);
    p += len;
    n -= len;
  }
  return static_cast<uint32_t>(c);
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

#include "tardelli/distributed/process_grid.h"

#include <algorithm>
#include <array>
#include <sstream>

#include "tardelli/core/error.h"

namespace td::distributed {

namespace {

// The five axes a layout is written over; "edp" (expert data parallel) is the dp slot of the
// expert layout (Note [Expert layout]).
constexpr std::array<const char*, 5> kAxisNames = {"tp", "cp", "ep", "dp", "pp"};

int axis_index(const std::string& token) {
  for (size_t i = 0; i < kAxisNames.size(); ++i)
    if (token == kAxisNames[i]) return static_cast<int>(i);
  return -1;
}

std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '-' || c == '_') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  out.push_back(cur);
  return out;
}

// One layout: the mixed radix of Note [Rank layout].
struct Layout {
  std::vector<int> axis;  // kAxisNames index of each position, fastest first
  std::vector<int> size;  // degree at each position
};

// `order` completed with the omitted axes (appended, like Megatron's RankGenerator).
std::vector<int> parse_order(const std::string& order) {
  std::vector<int> axes;
  for (const std::string& tok : split_tokens(order)) {
    int a = axis_index(tok);
    TD_CHECK(a >= 0, "ParallelDims: unknown axis '", tok, "' in order '", order,
             "' (expected names from tp, cp, ep, dp, pp joined by '-')");
    TD_CHECK(std::find(axes.begin(), axes.end(), a) == axes.end(), "ParallelDims: axis '", tok,
             "' appears twice in order '", order, "'");
    axes.push_back(a);
  }
  return axes;
}

Layout make_layout(const ParallelDims& d, bool expert) {
  std::array<int, 5> deg = expert ? std::array<int, 5>{d.tp, 1, d.ep, d.edp(), d.pp}
                                  : std::array<int, 5>{d.tp, d.cp, 1, d.dp, d.pp};
  Layout l;
  l.axis = parse_order(d.order);
  for (int a = 0; a < 5; ++a)
    if (std::find(l.axis.begin(), l.axis.end(), a) == l.axis.end()) l.axis.push_back(a);
  for (int a : l.axis) l.size.push_back(deg[a]);
  return l;
}

// Which positions of the layout the axes string selects, and whether it is an expert group.
struct Selection {
  bool expert = false;
  std::array<bool, 5> axis{};  // by kAxisNames index
};

Selection parse_axes(const std::string& axes) {
  Selection sel;
  bool dense_only = false;
  for (const std::string& tok : split_tokens(axes)) {
    int a = tok == "edp" ? 3 : axis_index(tok);
    TD_CHECK(a >= 0, "ParallelDims: unknown axis '", tok, "' in '", axes,
             "' (expected names from tp, cp, dp, pp, ep, edp joined by '-')");
    TD_CHECK(!sel.axis[a], "ParallelDims: axis '", tok, "' appears twice in '", axes, "'");
    sel.axis[a] = true;
    if (tok == "ep" || tok == "edp") sel.expert = true;
    if (tok == "dp" || tok == "cp") dense_only = true;
  }
  TD_CHECK(!(sel.expert && dense_only), "ParallelDims: '", axes,
           "' mixes the expert axes (ep, edp) with the dense axes dp and cp; expert groups are "
           "over tp, ep, edp, pp");
  return sel;
}

// Megatron-core's closed form: the members of group g over the selected positions are
// sum(masked index * masked stride) + sum(unmasked index of g * unmasked stride), where the
// indices are mixed-radix digits (first position fastest).
std::vector<std::vector<int>> groups_of(const Layout& l, const Selection& sel) {
  const size_t n = l.size.size();
  std::vector<int> stride(n);
  int world = 1;
  for (size_t i = 0; i < n; ++i) {
    stride[i] = world;
    world *= l.size[i];
  }
  std::vector<int> in_size, in_stride, out_size, out_stride;
  for (size_t i = 0; i < n; ++i) {
    bool masked = sel.axis[l.axis[i]];
    (masked ? in_size : out_size).push_back(l.size[i]);
    (masked ? in_stride : out_stride).push_back(stride[i]);
  }
  // Position of mixed-radix number `index` (digits of radix `sizes`) placed at `strides`.
  auto place = [](int index, const std::vector<int>& sizes, const std::vector<int>& strides) {
    int r = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      r += (index % sizes[i]) * strides[i];
      index /= sizes[i];
    }
    return r;
  };
  int group_size = 1;
  for (int s : in_size) group_size *= s;
  const int num_groups = world / group_size;
  std::vector<std::vector<int>> groups(num_groups, std::vector<int>(group_size));
  for (int g = 0; g < num_groups; ++g) {
    int base = place(g, out_size, out_stride);
    for (int k = 0; k < group_size; ++k) groups[g][k] = base + place(k, in_size, in_stride);
  }
  return groups;
}

std::array<int, 5> digits(const Layout& l, int rank) {
  std::array<int, 5> c{};
  for (size_t i = 0; i < l.size.size(); ++i) {
    c[l.axis[i]] = rank % l.size[i];
    rank /= l.size[i];
  }
  return c;
}

}  // namespace

void ParallelDims::validate(int world_size) const {
  TD_CHECK(tp >= 1 && cp >= 1 && pp >= 1 && dp >= 1 && ep >= 1,
           "ParallelDims: every degree must be >= 1, got ", str());
  TD_CHECK(static_cast<int64_t>(tp) * cp * pp * dp == world_size,
           "ParallelDims: tp*cp*pp*dp = ", static_cast<int64_t>(tp) * cp * pp * dp,
           " but world size is ", world_size, " (", str(), ")");
  TD_CHECK((dp * cp) % ep == 0, "ParallelDims: ep = ", ep, " must divide dp*cp = ", dp * cp,
           " (expert parallelism is carved out of the data and context parallel ranks; ", str(),
           ")");
  std::vector<int> given = parse_order(order);
  const std::array<int, 5> deg = {tp, cp, ep, dp, pp};
  for (int a = 0; a < 5; ++a) {
    bool named = std::find(given.begin(), given.end(), a) != given.end();
    TD_CHECK(named || (deg[a] == 1 && (a != 3 || edp() == 1)), "ParallelDims: ", kAxisNames[a],
             " = ", deg[a], " but order '", order, "' does not name it");
  }
  if (ep > 1 || cp > 1) {
    // Expert and dense layers share the tp and pp groups (Megatron asserts the same): an order
    // that puts pp (or tp) between the dp/cp/ep axes would give them different peers.
    Layout dense = make_layout(*this, false), expert = make_layout(*this, true);
    for (const char* ax : {"tp", "pp"}) {
      Selection sel = parse_axes(ax);
      TD_CHECK(groups_of(dense, sel) == groups_of(expert, sel), "ParallelDims: order '", order,
               "' gives expert layers different ", ax,
               " groups than dense layers; keep cp, ep and dp adjacent in the order (", str(), ")");
    }
  }
}

std::vector<std::vector<int>> ParallelDims::rank_groups(const std::string& axes) const {
  validate(world_size());
  Selection sel = parse_axes(axes);
  return groups_of(make_layout(*this, sel.expert), sel);
}

std::vector<int> ParallelDims::group_of(const std::string& axes, int rank) const {
  TD_CHECK(rank >= 0 && rank < world_size(), "ParallelDims: rank ", rank,
           " is outside the world of size ", world_size());
  for (auto& g : rank_groups(axes))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  TD_ERROR("ParallelDims: rank ", rank, " is in no '", axes, "' group");  // unreachable
}

GridCoords ParallelDims::coords(int rank) const {
  validate(world_size());
  TD_CHECK(rank >= 0 && rank < world_size(), "ParallelDims: rank ", rank,
           " is outside the world of size ", world_size());
  std::array<int, 5> d = digits(make_layout(*this, false), rank);
  std::array<int, 5> e = digits(make_layout(*this, true), rank);
  GridCoords c;
  c.tp = d[0];
  c.cp = d[1];
  c.dp = d[3];
  c.pp = d[4];
  c.ep = e[2];
  c.edp = e[3];
  return c;
}

int ParallelDims::rank_of(int tp_i, int cp_i, int pp_i, int dp_i) const {
  TD_CHECK(tp_i >= 0 && tp_i < tp && cp_i >= 0 && cp_i < cp && pp_i >= 0 && pp_i < pp &&
               dp_i >= 0 && dp_i < dp,
           "ParallelDims: coordinates (tp=", tp_i, ", cp=", cp_i, ", pp=", pp_i, ", dp=", dp_i,
           ") out of range for ", str());
  Layout l = make_layout(*this, false);
  const std::array<int, 5> c = {tp_i, cp_i, 0, dp_i, pp_i};
  int rank = 0, stride = 1;
  for (size_t i = 0; i < l.size.size(); ++i) {
    rank += c[l.axis[i]] * stride;
    stride *= l.size[i];
  }
  return rank;
}

std::string ParallelDims::str() const {
  std::ostringstream os;
  os << "ParallelDims(tp=" << tp << ", cp=" << cp << ", pp=" << pp << ", dp=" << dp << ", ep=" << ep
     << ", order=" << order << ")";
  return os.str();
}

// ---- ProcessGrid ----

const std::vector<std::string>& ProcessGrid::standard_axes() {
  static const std::vector<std::string> kAxes = {"tp",  "cp",    "pp",    "dp",    "ep",
                                                 "edp", "dp-cp", "tp-cp", "tp-pp", "tp-ep"};
  return kAxes;
}

std::string ProcessGrid::canonical(const std::string& axes) const {
  // The same axes in any spelling ("cp-dp", "dp_cp") name one group.
  Selection sel = parse_axes(axes);
  std::string key = sel.expert ? "E:" : "D:";
  for (int a = 0; a < 5; ++a) key += sel.axis[a] ? '1' : '0';
  return key;
}

ProcessGrid::ProcessGrid(CommPtr world, ParallelDims dims,
                         const std::vector<std::string>& extra_axes)
    : world_(std::move(world)), dims_(std::move(dims)) {
  TD_CHECK(world_ != nullptr, "ProcessGrid: the world communicator is null");
  dims_.validate(world_->size());
  coords_ = dims_.coords(world_->rank());
  for (int r = 0; r < world_->size(); ++r) world_ranks_.push_back(r);
  std::vector<std::string> all = standard_axes();
  all.insert(all.end(), extra_axes.begin(), extra_axes.end());
  const int me = world_->rank();
  for (const std::string& axes : all) {
    std::string key = canonical(axes);
    if (groups_.count(key)) continue;
    auto groups = dims_.rank_groups(axes);
    // color = my group's index, key = my index in it: split orders by key, so the new
    // communicator's rank i is the group's i-th member (Note [Rank layout]).
    int color = -1, pos = -1;
    for (size_t g = 0; g < groups.size() && color < 0; ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), me);
      if (it != groups[g].end()) {
        color = static_cast<int>(g);
        pos = static_cast<int>(it - groups[g].begin());
      }
    }
    TD_CHECK(color >= 0, "ProcessGrid: rank ", me, " is in no '", axes, "' group");
    CommPtr comm = world_->split(color, pos, axes);
    TD_CHECK(comm != nullptr && comm->size() == static_cast<int>(groups[color].size()) &&
                 comm->rank() == pos,
             "ProcessGrid: split for '", axes, "' gave rank ", comm ? comm->rank() : -1,
             " of size ", comm ? comm->size() : 0, ", expected rank ", pos, " of size ",
             groups[color].size());
    groups_[key] = std::move(comm);
    members_[key] = groups[color];
    names_.push_back(axes);
  }
}

const CommPtr& ProcessGrid::group(const std::string& axes) const {
  if (axes == "world") return world_;
  auto it = groups_.find(canonical(axes));
  if (it == groups_.end()) {
    std::string names;
    for (const auto& n : group_names()) names += (names.empty() ? "" : ", ") + n;
    TD_ERROR("ProcessGrid: no group '", axes, "' (built: ", names,
             "; pass extra axes to the constructor for others)");
  }
  return it->second;
}

const std::vector<int>& ProcessGrid::group_ranks(const std::string& axes) const {
  if (axes == "world") return world_ranks_;
  group(axes);  // the error for an unknown group
  return members_.at(canonical(axes));
}

const std::vector<std::string>& ProcessGrid::group_names() const {
  return names_;
}

}  // namespace td::distributed

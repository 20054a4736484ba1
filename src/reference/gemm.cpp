// The reference backend's grouped GEMM operation (moekit_gemm): read the caller's tensors, run the float64 math
// of reference/grouped_gemm.h, write back only what the operation owns (the groups' rows of a varlen-M output,
// the pair entries of dscores), rounding to each output's dtype.
#include <algorithm>
#include <vector>

#include "moekit/moekit.h"
#include "src/reference/dense.h"
#include "src/reference/grouped_gemm.h"
#include "src/reference/layer_io.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::gemm(const moekit_plan& plan, const moekit_gemm_args_t& args, Workspace, void*) {
  const moekit_gemm_desc_t& d = plan.gemm;
  bool varlen_k = d.mode == MOEKIT_GEMM_VARLEN_K;
  bool gated = d.epilogue == MOEKIT_EPILOGUE_GATED;
  bool dgated = d.epilogue == MOEKIT_EPILOGUE_DGATED;
  bool gather_a = d.gather == MOEKIT_GEMM_GATHER_A;
  bool gather_b = d.gather == MOEKIT_GEMM_GATHER_B;

  GroupedGemmSpec spec{};
  spec.mode = d.mode;
  spec.b_layout = d.b_layout;
  spec.gather = d.gather;
  spec.epilogue = d.epilogue;
  spec.groups = d.groups;
  spec.n = d.n;
  spec.k = d.k;
  spec.dtype = d.dtype;
  spec.act = ActivationSpec{d.activation, d.glu_layout, d.glu_limit, d.n};
  if ((gated || dgated) && is_gated(d.activation)) spec.act.width = d.n / 2;

  // M, the grouped rows this call was given (<= max_rows), and S, the rows of a gathered source.
  int64_t grouped_rows = (gather_a || gather_b) ? args.gather_idx.shape[0] : args.a.shape[0];
  std::vector<int64_t> offsets = read_offsets("offsets", args.offsets, d.groups, grouped_rows);
  int64_t rows = offsets.back();
  std::vector<int64_t> gather_idx;
  if (gather_a || gather_b) {
    int64_t source_rows = gather_a ? args.a.shape[0] : args.b.shape[0];
    gather_idx = read_indices(args.gather_idx, rows);
    require_in_range("gather_idx", gather_idx, 0, source_rows);
  }
  // A gathered operand is read whole (any source row may be addressed); a grouped one up to offsets[E].
  std::vector<double> a = read_values(args.a, gather_a ? -1 : rows);
  std::vector<double> b = read_values(args.b, varlen_k && !gather_b ? rows : -1);

  GroupedGemmOperands io;
  io.a = a.data();
  io.b = b.data();
  io.offsets = offsets.data();
  io.gather_idx = gather_idx.data();
  io.alpha = args.alpha;
  io.beta = (gated || dgated) ? 0.0 : args.beta;

  std::vector<double> bias;
  if (present(args.bias) && (d.epilogue == MOEKIT_EPILOGUE_BIAS || gated)) {
    bias = read_values(args.bias);
    io.bias = bias.data();
  }

  // C holds the whole tensor so grouped_gemm can address it; only the groups' part is read and written.
  std::vector<double> c(static_cast<size_t>(numel(args.c)));
  if (io.beta != 0.0) {
    std::vector<double> old = read_values(args.c, varlen_k ? -1 : rows);
    std::copy(old.begin(), old.end(), c.begin());
  }
  io.c = c.data();

  std::vector<double> act, h, row_scale, dscores;
  std::vector<int64_t> pair_idx;
  if (gated || dgated) {
    act.resize(static_cast<size_t>(numel(args.act)));
    io.act = act.data();
  }
  if (dgated) {
    h = read_values(args.h, rows);
    h.resize(static_cast<size_t>(numel(args.h)));
    row_scale = read_values(args.row_scale);
    pair_idx = read_indices(args.pair_idx, rows);
    dscores.resize(static_cast<size_t>(numel(args.dscores)));
    int64_t pairs = std::min<int64_t>(static_cast<int64_t>(row_scale.size()), static_cast<int64_t>(dscores.size()));
    require_in_range("pair_idx", pair_idx, 0, pairs);
    io.h = h.data();
    io.row_scale = row_scale.data();
    io.pair_idx = pair_idx.data();
    io.dscores = dscores.data();
  }

  grouped_gemm(spec, io);

  if (varlen_k) {
    write_values(args.c, c);
    return;
  }
  write_values(args.c, c, 0, rows);
  if (gated || dgated) write_values(args.act, act, 0, rows);
  if (dgated) {
    moekit_tensor_t flat = flat_view(args.dscores);
    for (int64_t p : pair_idx) write_values(flat, dscores, p, p + 1);
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit

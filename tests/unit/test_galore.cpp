// SPDX-License-Identifier: Apache-2.0
// GaLoreAdamW on one device, every execution space: (1) trajectories hand-computed in plain
// Python (tests/reference/galore_hand_computed.py: SVD refreshes, right and left projections,
// rank >= min(m, n), correct_bias false, weight decay, a 1-D parameter in a GaLore group, a
// rank-0 group); (2) the 8-bit step is exactly dequantize -> Adam -> quantize, within the
// round-trip bound of the block; (3) 8-bit GaLore stays close to fp32 GaLore; (4) measured state
// bytes against the shapes; state dictionaries, NaN gradients, option errors and layouts.
#include <lather/impl/quantization.hpp>
#include <lather/optimizers/adam.hpp>
#include <lather/optimizers/galore.hpp>

#include <Kokkos_Core.hpp>

#include <doctest/doctest.h>

#include "exec_spaces.hpp"
#include "test_utils.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {

using doctest::Contains;
using lather::GaLoreOptions;
using lather::GaLoreProjection;

// ---- the Python script's gradients and initial values (exact small rationals) ------------------

double grad_value(long t, long i, long j, long salt) {
  return static_cast<double>((7 * t + 3 * i + 5 * j + 2 * i * j + salt) % 13 - 6) / 8.0 +
         static_cast<double>((t * (i + 1) + j * salt) % 5) / 16.0;
}
double init_value(long i, long j, long salt) { return static_cast<double>((3 * i + 5 * j + salt) % 7 - 3) / 10.0; }

// Parameters and gradients as flat Views seen through TensorRefs of any shape.
template <class T, class M>
struct Tensors {
  std::vector<Kokkos::View<T*, M>> p_store, g_store;
  std::vector<lather::TensorRef<T, M>> params, grads;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<long> salts;

  static std::int64_t numel(const std::vector<std::int64_t>& s) {
    std::int64_t n = 1;
    for (auto e : s) n *= e;
    return n;
  }
  static std::int64_t cols(const std::vector<std::int64_t>& s) {
    return s.empty() ? 1 : (s[0] > 0 ? numel(s) / s[0] : 0);
  }
  void add(std::vector<std::int64_t> shape, long salt) {
    const auto n = static_cast<std::size_t>(numel(shape));
    p_store.emplace_back("test::p", n);
    g_store.emplace_back("test::g", n);
    params.emplace_back(p_store.back().data(), shape);
    grads.emplace_back(g_store.back().data(), shape);
    shapes.push_back(shape);
    salts.push_back(salt);
    std::vector<double> v(n);
    const std::int64_t c = cols(shape);
    for (std::size_t f = 0; f < n; ++f) v[f] = init_value(static_cast<long>(f) / c, static_cast<long>(f) % c, salt);
    lather::test::from_host(params.back(), v);
  }
  void set_grads(long t) {
    for (std::size_t k = 0; k < params.size(); ++k) {
      const std::int64_t c = cols(shapes[k]);
      std::vector<double> v(static_cast<std::size_t>(numel(shapes[k])));
      for (std::size_t f = 0; f < v.size(); ++f)
        v[f] = grad_value(t, static_cast<long>(f) / c, static_cast<long>(f) % c, salts[k]);
      lather::test::from_host(grads[k], v);
    }
  }
  void set_grads(const std::vector<std::vector<double>>& g) {
    for (std::size_t k = 0; k < params.size(); ++k) lather::test::from_host(grads[k], g[k]);
  }
  std::vector<double> value(std::size_t k) const { return lather::test::to_host(params[k]); }
};

// ---- (1) hand-computed trajectories (python3 tests/reference/galore_hand_computed.py) ------------

const std::vector<std::vector<double>> case_a_p0 = {
    {-0.22268983773982245, 0.31893822249414305, 0.08342751832862587, 0.07581296904784698, -0.07907236747258754, -0.31457791962894466, -0.27480998250778665, 0.17856157294077268, 0.016072559145290592, 0.0030240629133950316, -0.17523499104429616, 0.32425808548585666},
    {-0.23332016465452482, 0.3154572947179179, 0.06424024332064991, 0.07220190609930814, -0.0948731987632924, -0.3322621723491143, -0.2568671455907809, 0.17189671110100221, 0.034893892595625337, -0.0007916224170491921, -0.1671045943193519, 0.3236315144199613},
    {-0.2505264636528365, 0.3246827045975797, 0.07414835555055414, 0.05021301494979297, -0.10620313907534758, -0.31538787933378504, -0.23879681476244297, 0.1510078676274852, 0.026687651322916048, -0.00296451502380479, -0.1569032375668704, 0.32217954414597477},
    {-0.2672463926843446, 0.32723460779272817, 0.084610748065129, 0.03263386433145222, -0.10545988812327654, -0.3028730656716817, -0.2368846181532669, 0.1356160660273696, 0.02799278126059485, -0.01062732734281549, -0.1589168818404533, 0.3257890055127658},
    {-0.2835981455222759, 0.3384662701254673, 0.07759677530559357, 0.02651560859338299, -0.0978687960005514, -0.3008234398450732, -0.23172848953237382, 0.11854333216988319, 0.015715117609697363, -0.01589307081736096, -0.15249604263384567, 0.3239495713223217},
};
const std::vector<std::vector<double>> case_a_p1 = {
    {-0.09546124714695882, -0.273657846971521, 0.19496008107225005, -0.024841565098566717, -0.17420052360180352, 0.16415821665749009, 0.0009864706293393703, -0.1641573870876155, 0.2975116772311823, 0.10053822448474094, -0.19634739657557654, 0.27361510974752995, 0.09684839704178126, -0.07461533978031554, -0.32335236855741756},
    {-0.08701627076638672, -0.2629501047033047, 0.19744675194404776, -0.03693983339552429, -0.1574358578730399, 0.13784121732355661, 0.02004816324042085, -0.15813812968302854, 0.3154421265700822, 0.09284522962539828, -0.19840732307981354, 0.2593137380863198, 0.09192821055047044, -0.06580763178612162, -0.3361598379042169},
    {-0.09090577138100102, -0.25770799196429794, 0.18698800212111016, -0.04458659841751861, -0.16426938633457022, 0.1557344104271975, 0.020195888536693258, -0.144001173213267, 0.2998822559777433, 0.08808602270464407, -0.21222477237126647, 0.25381341825930864, 0.08723124180783004, -0.04319076874108616, -0.32239028367380934},
    {-0.09074369461718228, -0.2588681381748188, 0.18375979524740613, -0.049846596043303326, -0.17285505613401758, 0.17091667094421212, 0.027806276953604426, -0.14146643712869567, 0.3013156288189442, 0.08086640213065305, -0.22732405803733366, 0.24705619344620544, 0.0872296350461593, -0.04048636569832728, -0.30433281187881733},
    {-0.09865477992867557, -0.25627480995024343, 0.17558306700380005, -0.04753071384589209, -0.18134975394495992, 0.17922086980007024, 0.027886617478404024, -0.13531883332993863, 0.2979151691117036, 0.08844723430631299, -0.20577805346733707, 0.2589622408684728, 0.07959806435427716, -0.041660842242583714, -0.3024517673826224},
};
const std::vector<std::vector<double>> case_a_p2 = {
    {-0.09949440659663479, 0.3979949659086721, -1.677832370500308e-05},
    {-0.14800633974825772, 0.4150582186350888, -0.04918596035316928},
    {-0.22103046564469306, 0.46349259304944146, -0.08694801460195994},
    {-0.28708279314104296, 0.47370035113958847, -0.1511859023879218},
    {-0.3636116230646517, 0.50476201766783, -0.1975885500459048},
};
const std::vector<std::vector<double>> case_a_p3 = {
    {1.4545452495240419e-08, -2.666665963046988e-08, -0.3999999800000039, -0.20000001999999606, 0.10000003199998984, 0.09999998000000393},
    {-0.08040299892138347, -0.03888890979423248, -0.38582235790988717, -0.2141776420901128, 0.11417765288407689, 0.08582235790988718},
    {-0.19930522014409552, -0.051331272857475234, -0.42905081845627163, -0.17094918154372835, 0.057859330867572875, 0.09213507734624629},
    {-0.3139294407698922, -0.134449728352775, -0.4332368872977185, -0.19868950703098906, 0.05626252135563537, 0.033974254884779224},
    {-0.3377380194349598, -0.2125912331679371, -0.4984940236328418, -0.1841838707972972, -0.021475314740244007, -0.005754312538766369},
};
const std::vector<std::vector<double>> case_b_p0 = {
    {0.18552185420310344, -0.006446407681785741, -0.2011427861943319, 0.3068889519207789, -0.19673016007262015, 0.2931472021252825, 0.09528813403242785, -0.1148345037696695, 0.09150414628489513, -0.09879731888782921, -0.3143097904487107, 0.19538874437856493},
    {0.17582958217352146, -0.01540352387837218, -0.19852012518220905, 0.3102467687658973, -0.199524454162346, 0.2901061653934836, 0.08636825926989775, -0.12400112117427267, 0.08077780043932567, -0.10060515362638965, -0.32032910831207195, 0.1982879376222127},
    {0.17138381722431817, -0.017722940386708554, -0.20134781439644034, 0.30954542799253293, -0.20018799513023097, 0.2854178305215922, 0.0793794935439265, -0.1350146808042503, 0.07082638874854529, -0.10142148296257911, -0.32945981091361215, 0.1982923173752634},
    {0.1699287446668442, -0.025032657077955166, -0.20410372090314544, 0.30832985614227615, -0.19917579710519132, 0.28260400839485234, 0.0719053924836111, -0.12910036251565907, 0.07063532502091861, -0.10981050222289872, -0.33605945853766833, 0.20095373455059895},
    {0.17003042658451314, -0.03143919724236314, -0.20816534464766268, 0.30987612082723104, -0.19798878926884383, 0.2769734111481103, 0.06824682064247112, -0.1265770751101421, 0.06875443931631252, -0.11598851147587226, -0.3440015589000727, 0.20348492180455277},
    {0.16797636446366263, -0.033209306180373, -0.21054890841272658, 0.30916720429567596, -0.1993806024656512, 0.27310720071205186, 0.06188476416972586, -0.12416389856140511, 0.06846153528765149, -0.12313210554512344, -0.35106650228220393, 0.20670482679517732},
    {0.16975292602204914, -0.035572321457402994, -0.2154090187516393, 0.3089684365143193, -0.19987715424050045, 0.26591583512278166, 0.05867521395534791, -0.127244896430625, 0.06640228711571068, -0.12887074445598376, -0.35075578274257524, 0.19925111541355714},
};
const std::vector<std::vector<double>> case_b_p1 = {
    {0.3188183155425055, 0.09261252203174199, -0.1075346366114808, -0.32518792784477, 0.20009597228663276, 0.010197156616779075, -0.2197216796650267, 0.3026246941129711},
    {0.32475759863903314, 0.07932901672756738, -0.12205962181787934, -0.3319369046752111, 0.2045433403563895, 0.014517607614385478, -0.22815461420991126, 0.3143517696139868},
    {0.33454483088894643, 0.06869568776241515, -0.1321498380222724, -0.3459008123218631, 0.20683744419725533, 0.02108933099339602, -0.23953377257343536, 0.3221825700244134},
    {0.3307447701492622, 0.08348509447250768, -0.15110490283892036, -0.34690367104494996, 0.21123192196552845, 0.007464372870605225, -0.23186737099587046, 0.3288632526747969},
    {0.32888508029432467, 0.09219783882593335, -0.1629229239341058, -0.35222907308209256, 0.21350072926608976, -0.0003421569892641972, -0.22687425412121887, 0.33511122572460283},
    {0.32555962981478076, 0.10335050286294203, -0.17766446565448663, -0.3578715918432503, 0.2172604906614998, -0.010389444383421854, -0.22106694557479545, 0.34253543146066023},
    {0.3320725963389845, 0.10728896865228035, -0.1854996142973414, -0.36400770934059923, 0.2091021454348382, -0.011897512830137864, -0.2353758768328793, 0.34457822031692287},
};
const std::vector<std::vector<double>> case_b_p2 = {
    {-0.2384319835098032, 0.09880333367450676, -0.0479851919554903, 0.06066803013166829, -0.29999668894509807, 0.25111479725482727},
    {-0.24069405327713453, 0.10344384238248691, -0.04548629758718238, 0.1022321201671707, -0.36831798126276477, 0.21734250060595636},
    {-0.20882635642346592, 0.0514894125294184, -0.06998437244247926, 0.17040581396280569, -0.4807637803667479, 0.16252610682128724},
    {-0.3101390623367011, 0.07707159347676816, -0.029458030313229695, 0.010516587970676911, -0.439083224470604, 0.22507165745667754},
    {-0.3717048311613545, 0.09261882949575173, -0.004652757147218129, -0.12597852442685384, -0.40331293459846, 0.2783670336562299},
    {-0.4649310872313063, 0.11615939727889346, 0.03267269617106076, -0.20404368615841748, -0.38229841842178097, 0.3085557476542823},
    {-0.42055537673453935, 0.012084911865699295, 0.12010444473179749, -0.20083929428483563, -0.38740743582088716, 0.3129091670115263},
};

// max |a - b| / max |b| over a trajectory of parameter values.
double trajectory_error(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want) {
  double num = 0, den = 0;
  for (std::size_t s = 0; s < want.size(); ++s)
    for (std::size_t e = 0; e < want[s].size(); ++e) {
      num = std::max(num, std::abs(got[s][e] - want[s][e]));
      den = std::max(den, std::abs(want[s][e]));
    }
  return num / den;
}

template <class T, class ExecSpace>
void impl_test_hand_computed(double tol) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const ExecSpace space;
  {
    Tensors<T, M> a;
    a.add({4, 3}, 1);
    a.add({3, 5}, 2);
    a.add({3}, 3);
    a.add({2, 3}, 4);
    const GaLoreOptions ga{.lr = 0.1, .betas = {0.9, 0.999}, .eps = 1e-6, .weight_decay = 0.05, .correct_bias = true,
                           .rank = 2, .update_proj_gap = 2, .scale = 0.25};
    const GaLoreOptions gb{.lr = 0.05, .betas = {0.8, 0.99}, .eps = 1e-8, .weight_decay = 0.0, .correct_bias = false,
                           .rank = 0, .update_proj_gap = 2};
    std::span<P> all(a.params);
    lather::GaLoreAdamW<P, ExecSpace> opt(
        std::vector<lather::ParamGroup<P, GaLoreOptions>>{{all.subspan(0, 3), ga}, {all.subspan(3, 1), gb}});
    CHECK(opt.layout(0).projected);
    CHECK(opt.layout(0).right);  // (4, 3): m >= n projects dim 1
    CHECK(opt.layout(0).state_shape == std::vector<std::int64_t>{4, 2});
    CHECK(opt.layout(0).projector_shape == std::vector<std::int64_t>{2, 3});
    CHECK(opt.layout(1).projected);
    CHECK(!opt.layout(1).right);  // (3, 5): left
    CHECK(opt.layout(1).state_shape == std::vector<std::int64_t>{2, 5});
    CHECK(opt.layout(1).projector_shape == std::vector<std::int64_t>{3, 2});
    CHECK(!opt.layout(2).projected);  // 1-D
    CHECK(!opt.layout(3).projected);  // rank 0
    const std::vector<const std::vector<std::vector<double>>*> want{&case_a_p0, &case_a_p1, &case_a_p2, &case_a_p3};
    std::vector<std::vector<std::vector<double>>> got(4);
    for (long t = 1; t <= 5; ++t) {
      a.set_grads(t);
      opt.step(space, a.grads);
      for (std::size_t k = 0; k < 4; ++k) got[k].push_back(a.value(k));
    }
    for (std::size_t k = 0; k < 4; ++k) {
      const double err = trajectory_error(got[k], *want[k]);
      MESSAGE("case A param " << k << ": max relative difference " << err);
      CHECK(err <= tol);
    }
    CHECK(opt.state(0, "projector").shape == std::vector<std::int64_t>{2, 3});
    CHECK(opt.state(0, "exp_avg").shape == std::vector<std::int64_t>{4, 2});
    CHECK(opt.state(1, "exp_avg_sq").shape == std::vector<std::int64_t>{2, 5});
    CHECK(opt.state(2, "exp_avg").shape == std::vector<std::int64_t>{3});
    CHECK_THROWS_WITH_AS((void)opt.state(2, "projector"), Contains("has no state buffer 'projector'"),
                         lather::invalid_argument);
  }
  {
    Tensors<T, M> b;
    b.add({3, 4}, 5);
    b.add({4, 2}, 6);
    b.add({2, 3}, 7);
    const GaLoreOptions gr{.lr = 0.02, .rank = 4, .update_proj_gap = 3, .scale = 0.5, .proj_type = GaLoreProjection::right};
    const GaLoreOptions gl{.lr = 0.02, .rank = 4, .update_proj_gap = 3, .scale = 1.0, .proj_type = GaLoreProjection::left};
    const GaLoreOptions gv{.lr = 0.03, .betas = {0.85, 0.995}, .eps = 1e-7, .weight_decay = 0.1, .correct_bias = false,
                           .rank = 1, .update_proj_gap = 3, .scale = 2.0, .proj_type = GaLoreProjection::reverse_standard};
    std::span<P> all(b.params);
    lather::GaLoreAdamW<P, ExecSpace> opt(std::vector<lather::ParamGroup<P, GaLoreOptions>>{
        {all.subspan(0, 1), gr}, {all.subspan(1, 1), gl}, {all.subspan(2, 1), gv}});
    CHECK(opt.layout(0).right);
    CHECK(opt.layout(0).rank == 3);  // rank 4 clipped to min(3, 4)
    CHECK(!opt.layout(1).right);
    CHECK(opt.layout(1).rank == 2);
    CHECK(opt.layout(2).right);  // reverse_std on a wide (2, 3): right
    CHECK(opt.layout(2).rank == 1);
    const std::vector<const std::vector<std::vector<double>>*> want{&case_b_p0, &case_b_p1, &case_b_p2};
    std::vector<std::vector<std::vector<double>>> got(3);
    for (long t = 1; t <= 7; ++t) {
      b.set_grads(t);
      opt.step(space, b.grads);
      for (std::size_t k = 0; k < 3; ++k) got[k].push_back(b.value(k));
    }
    for (std::size_t k = 0; k < 3; ++k) {
      const double err = trajectory_error(got[k], *want[k]);
      MESSAGE("case B param " << k << ": max relative difference " << err);
      CHECK(err <= tol);
    }
  }
}

// A parameter of more than two dimensions is the matrix (shape[0], numel / shape[0]); a strided
// (LayoutLeft) parameter gives the row-major result.
template <class ExecSpace>
void impl_test_shapes_and_layouts() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  const ExecSpace space;
  const GaLoreOptions o{.lr = 0.05, .weight_decay = 0.01, .rank = 2, .update_proj_gap = 2};
  Tensors<double, M> a, b;
  a.add({4, 3, 2}, 8);
  b.add({4, 6}, 8);
  lather::GaLoreAdamW<P, ExecSpace> oa(std::span<P>(a.params), o), ob(std::span<P>(b.params), o);
  CHECK(oa.layout(0).rows == 4);
  CHECK(oa.layout(0).cols == 6);
  CHECK(!oa.layout(0).right);  // 4 < 6: left
  using L = Kokkos::View<double**, Kokkos::LayoutLeft, M>;
  L left("test::left", 4, 6), left_grad("test::left_grad", 4, 6);
  {
    auto h = Kokkos::create_mirror_view(left);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) h(i, j) = init_value(i, j, 8);
    Kokkos::deep_copy(left, h);
  }
  std::vector<L> lp{left};
  lather::GaLoreAdamW<L, ExecSpace> ol(std::span<L>(lp), o);
  for (long t = 1; t <= 5; ++t) {
    a.set_grads(t);
    b.set_grads(t);
    auto h = Kokkos::create_mirror_view(left_grad);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) h(i, j) = grad_value(t, i, j, 8);
    Kokkos::deep_copy(left_grad, h);
    oa.step(space, a.grads);
    ob.step(space, b.grads);
    ol.step(space, std::vector<L>{left_grad});
  }
  CHECK(a.value(0) == b.value(0));
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), left);
  std::vector<double> lv;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) lv.push_back(h(i, j));
  CHECK(lv == b.value(0));
}

// ---- (2) the 8-bit step: dequantize -> Adam -> quantize, exactly --------------------------------

std::vector<double> random_grad(std::size_t n, std::uint64_t stream, double scale = 1.0) {
  // Magnitudes over three decades, so that blocks use the maps' small entries too.
  std::vector<double> r = lather::test::random_values(n, stream, scale), e = lather::test::random_values(n, stream + 7);
  for (std::size_t i = 0; i < n; ++i) r[i] *= std::pow(10.0, -1.5 * std::abs(e[i]));
  return r;
}

template <class T>
std::vector<T> values_as(const lather::StateTensor& t) {
  std::vector<T> out;
  std::visit([&](const auto& v) { for (auto x : v) out.push_back(static_cast<T>(x)); }, t.values);
  return out;
}

template <class T, class ExecSpace>
void impl_test_quantized_step() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  namespace quant = lather::impl::quant;
  const ExecSpace space;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;
  // Full-space 8-bit Adam (rank 0) on 40 elements in blocks of 16 (the last one partial).
  const GaLoreOptions o{.lr = 0.01, .betas = {0.9, 0.99}, .eps = 1e-8, .weight_decay = 0.1, .rank = 0,
                        .quantize_states = true, .block_size = 16, .min_8bit_size = 0};
  Tensors<T, M> a;
  a.add({40}, 9);
  lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(a.params), o);
  REQUIRE(opt.layout(0).quantized);
  CHECK(opt.state(0, "exp_avg_absmax").shape == std::vector<std::int64_t>{3});
  CHECK(opt.state(0, "exp_avg_codes").shape == std::vector<std::int64_t>{40});
  const auto smap = quant::dynamic_map(true), umap = quant::dynamic_map(false);
  const double slack = 4.0 * std::numeric_limits<float>::epsilon();
  double worst = 0;  // largest round-trip error / (absmax * half gap)
  for (long t = 1; t <= 6; ++t) {
    const std::vector<double> gd = random_grad(40, 1000 + static_cast<std::uint64_t>(t));
    a.set_grads(std::vector<std::vector<double>>{gd});
    const std::vector<double> p0 = a.value(0);
    const auto mc = values_as<std::int64_t>(opt.state(0, "exp_avg_codes")),
               vc = values_as<std::int64_t>(opt.state(0, "exp_avg_sq_codes"));
    const auto ma = values_as<float>(opt.state(0, "exp_avg_absmax")),
               va = values_as<float>(opt.state(0, "exp_avg_sq_absmax"));
    opt.step(space, a.grads);
    // Host reference in T, the kernel's operation order.
    const T b1 = T(0.9), b2 = T(0.99), omb1 = T(1.0 - 0.9), omb2 = T(1.0 - 0.99), eps = T(1e-8);
    std::vector<T> m(40), v(40);
    for (std::size_t l = 0; l < 40; ++l) {
      const T g = static_cast<T>(gd[l]);
      m[l] = T(smap[static_cast<std::size_t>(mc[l])]) * T(ma[l / 16]) * b1 + omb1 * g;
      v[l] = T(umap[static_cast<std::size_t>(vc[l])]) * T(va[l / 16]) * b2 + omb2 * g * g;
    }
    const auto mc1 = values_as<std::int64_t>(opt.state(0, "exp_avg_codes")),
               vc1 = values_as<std::int64_t>(opt.state(0, "exp_avg_sq_codes"));
    const auto ma1 = values_as<float>(opt.state(0, "exp_avg_absmax")),
               va1 = values_as<float>(opt.state(0, "exp_avg_sq_absmax"));
    const double bc1 = 1.0 - std::pow(0.9, double(t)), bc2 = 1.0 - std::pow(0.99, double(t));
    const T neg_step = -static_cast<T>(0.01 * std::sqrt(bc2) / bc1), neg_decay = static_cast<T>(-0.01 * 0.1);
    const std::vector<double> p1 = a.value(0);
    for (std::size_t b = 0; b < 3; ++b) {
      T mm = 0, vm = 0;
      for (std::size_t l = 16 * b; l < std::min<std::size_t>(40, 16 * b + 16); ++l) {
        mm = std::max(mm, std::abs(m[l]));
        vm = std::max(vm, v[l]);
      }
      if (host) {
        CHECK(ma1[b] == static_cast<float>(mm));
        CHECK(va1[b] == static_cast<float>(vm));
      } else {  // device FMA contraction rounds m and v once less: last bits (an H200 agreed to 6 digits)
        CHECK(ma1[b] == doctest::Approx(static_cast<float>(mm)).epsilon(1e-6));
        CHECK(va1[b] == doctest::Approx(static_cast<float>(vm)).epsilon(1e-6));
      }
    }
    for (std::size_t l = 0; l < 40; ++l) {
      const float am = ma1[l / 16], av = va1[l / 16];
      const auto cm = quant::nearest_code(smap.data(), am == 0.0f ? T(0) : m[l] / T(am));
      const auto cv = quant::nearest_code(umap.data(), av == 0.0f ? T(0) : v[l] / T(av));
      if (host) {
        CHECK(mc1[l] == cm);
        CHECK(vc1[l] == cv);
      } else {  // device FMA contraction may move a value across a midpoint: one code at most
        CHECK(std::abs(mc1[l] - cm) <= 1);
        CHECK(std::abs(vc1[l] - cv) <= 1);
      }
      // Round trip within the block's bound (quantization.hpp's half gap at x / absmax).
      const double dm = double(smap[static_cast<std::size_t>(mc1[l])]) * am, dv = double(umap[static_cast<std::size_t>(vc1[l])]) * av;
      const double bm = am * (quant::half_gap_at(smap, double(m[l]) / am) + slack);
      const double bv = av * (quant::half_gap_at(umap, double(v[l]) / av) + slack);
      CHECK(std::abs(dm - double(m[l])) <= bm);
      CHECK(std::abs(dv - double(v[l])) <= bv);
      worst = std::max({worst, std::abs(dm - double(m[l])) / (am * quant::max_half_gap(smap)),
                        std::abs(dv - double(v[l])) / (av * quant::max_half_gap(umap))});
      // The parameter moves with the unquantized moments (bitsandbytes' order), then decays.
      T p = static_cast<T>(p0[l]);
      p = p + neg_step * (m[l] / (std::sqrt(v[l]) + eps));
      p = p + neg_decay * p;
      if (host) CHECK(p1[l] == double(p));
      else CHECK(p1[l] == doctest::Approx(double(p)).epsilon(1e-6));
    }
  }
  MESSAGE("8-bit round trip: largest error / (absmax * largest half gap) = " << worst);
  CHECK(worst <= 1.0 + 1e-3);
}

// ---- (3) 8-bit GaLore close to fp32 GaLore; (4) measured state bytes ----------------------------

template <class ExecSpace>
void impl_test_8bit_vs_fp32() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<float, M>;
  const ExecSpace space;
  // (256, 64) at rank 16: a 256 x 16 = 4096-element low-rank state (8-bit with bitsandbytes'
  // defaults: min_8bit_size 4096, block 256); (64, 32) at rank 16: 1024 elements, stays fp32.
  const GaLoreOptions fp{.lr = 1e-2, .weight_decay = 0.01, .rank = 16, .update_proj_gap = 5};
  GaLoreOptions q8 = fp;
  q8.quantize_states = true;
  Tensors<float, M> a, b;
  for (auto* t : {&a, &b}) {
    t->add({256, 64}, 10);
    t->add({64, 32}, 11);
  }
  const std::vector<double> w0 = a.value(0);
  lather::GaLoreAdamW<P, ExecSpace> o32(std::span<P>(a.params), fp), o8(std::span<P>(b.params), q8);
  CHECK(!o32.layout(0).quantized);
  CHECK(o8.layout(0).quantized);
  CHECK(!o8.layout(1).quantized);  // 512 < min_8bit_size
  CHECK(o8.layout(0).blocks_aligned);
  // Measured state bytes against the shapes (float parameters).
  const std::size_t fp32_bytes = 2 * 256 * 16 * 4 + 16 * 64 * 4;       // m, v (256 x 16) + P (16 x 64)
  const std::size_t q8_bytes = 2 * (256 * 16 + 16 * 4) + 16 * 64 * 4;  // codes + 16 absmax each + P
  const std::size_t small = 2 * 64 * 16 * 4 + 16 * 32 * 4;             // the (64, 32) parameter, fp32 either way
  CHECK(o32.state_bytes() == fp32_bytes + small);
  CHECK(o8.state_bytes() == q8_bytes + small);
  CHECK(o8.workspace_bytes() == 256 * 16 * 8);  // the largest low-rank gradient, in double, shared
  Tensors<float, M> c;
  c.add({256, 64}, 10);
  std::vector<P> big{c.params[0]};
  lather::AdamW<P, ExecSpace> adamw(big, lather::AdamWOptions{});
  c.set_grads(1);
  adamw.step(space, c.grads);  // AdamW's buffers exist from the first step on
  std::size_t adamw_bytes = 0;
  for (const char* name : {"exp_avg", "exp_avg_sq"}) adamw_bytes += adamw.state(0, name).span() * sizeof(float);
  CHECK(adamw_bytes == 2 * 256 * 64 * 4);
  lather::GaLoreAdamW<P, ExecSpace> plain(std::span<P>(big), GaLoreOptions{.rank = 0});
  CHECK(plain.state_bytes() == adamw_bytes);  // rank 0 is AdamW's state
  MESSAGE("state bytes of a (256, 64) float parameter at rank 16: AdamW " << adamw_bytes << ", GaLore fp32 "
          << fp32_bytes << " (" << double(fp32_bytes) / double(adamw_bytes) << "), GaLore 8-bit " << q8_bytes << " ("
          << double(q8_bytes) / double(adamw_bytes) << ")");
  // Trajectories: the cumulative change of the 8-bit run relative to the fp32 run.
  for (long t = 1; t <= 12; ++t) {
    const std::vector<std::vector<double>> g{random_grad(256 * 64, 2000 + t), random_grad(64 * 32, 3000 + t)};
    a.set_grads(g);
    b.set_grads(g);
    o32.step(space, a.grads);
    o8.step(space, b.grads);
  }
  const std::vector<double> w32 = a.value(0), w8 = b.value(0);
  double num = 0, den = 0;
  for (std::size_t e = 0; e < w0.size(); ++e) {
    num = std::max(num, std::abs(w8[e] - w32[e]));
    den = std::max(den, std::abs(w32[e] - w0[e]));
  }
  MESSAGE("8-bit vs fp32 GaLore after 12 steps: max |dW8 - dW32| / max |dW32| = " << num / den);
  CHECK(num / den <= 0.05);
  CHECK(b.value(1) == a.value(1));  // the unquantized parameter is unaffected
}

// ---- state dictionaries, NaN gradients, options --------------------------------------------------

template <class T, class ExecSpace>
void impl_test_state_dict(bool quantized) {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<T, M>;
  const ExecSpace space;
  const GaLoreOptions o{.lr = 0.02, .weight_decay = 0.01, .rank = 3, .update_proj_gap = 3, .quantize_states = quantized,
                        .block_size = 8, .min_8bit_size = 0};
  Tensors<T, M> a, b;
  for (auto* t : {&a, &b}) {
    t->add({8, 5}, 12);
    t->add({4, 9}, 13);
    t->add({6}, 14);
  }
  lather::GaLoreAdamW<P, ExecSpace> oa(std::span<P>(a.params), o);
  for (long t = 1; t <= 4; ++t) {
    a.set_grads(t);
    oa.step(space, a.grads);
  }
  const lather::StateDict d = oa.state_dict();
  if (quantized) {
    CHECK(d.tensors.count("state.0.exp_avg_codes") == 1);
    CHECK(d.tensors.count("state.0.exp_avg") == 0);
  }
  lather::GaLoreAdamW<P, ExecSpace> ob(std::span<P>(b.params), o);
  for (std::size_t k = 0; k < 3; ++k) lather::test::from_host(b.params[k], a.value(k));
  ob.load_state_dict(d);
  CHECK(ob.state_dict().tensors == d.tensors);
  for (long t = 5; t <= 9; ++t) {  // refreshes at 7
    a.set_grads(t);
    b.set_grads(t);
    oa.step(space, a.grads);
    ob.step(space, b.grads);
  }
  for (std::size_t k = 0; k < 3; ++k) CHECK(a.value(k) == b.value(k));
  // Options that size the state cannot change; others can.
  GaLoreOptions other = o;
  other.rank = 2;
  CHECK_THROWS_WITH_AS(ob.set_options(0, other), Contains("change the shape of the optimizer state"),
                       lather::invalid_argument);
  other = o;
  other.update_proj_gap = 10;
  ob.set_options(0, other);
  CHECK(ob.options().update_proj_gap == 10);
}

template <class ExecSpace>
void impl_test_nonfinite() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  const ExecSpace space;
  Tensors<double, M> a;
  a.add({5, 4}, 15);
  a.add({3}, 16);
  lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(a.params), GaLoreOptions{.rank = 2, .update_proj_gap = 2});
  a.set_grads(1);
  opt.step(space, a.grads);
  const auto p0 = a.value(0), p1 = a.value(1);
  const lather::StateDict before = opt.state_dict();
  std::vector<std::vector<double>> g{std::vector<double>(20, 0.5), std::vector<double>(3, 0.25)};
  g[0][7] = std::numeric_limits<double>::quiet_NaN();
  a.set_grads(g);
  CHECK_THROWS_WITH_AS(opt.step(space, a.grads), Contains("NaN or Inf"), lather::invalid_argument);
  CHECK(a.value(0) == p0);
  CHECK(a.value(1) == p1);
  CHECK(opt.state_dict().tensors == before.tensors);
  CHECK(opt.step_count(0) == 1);
  opt.set_nonfinite_policy(lather::NonFinitePolicy::skip_parameter);
  opt.step(space, a.grads);  // step 2 (a refresh step for nobody: the bad parameter is skipped)
  CHECK(a.value(0) == p0);
  CHECK(a.value(1) != p1);
  CHECK(opt.step_count(0) == 1);
  CHECK(opt.step_count(1) == 2);
}

template <class ExecSpace>
void impl_test_options() {
  using M = typename ExecSpace::memory_space;
  using P = lather::TensorRef<double, M>;
  Tensors<double, M> a;
  a.add({4, 3}, 17);
  std::span<P> s(a.params);
  const auto make = [&](GaLoreOptions o) { lather::GaLoreAdamW<P, ExecSpace> opt(s, o); };
  CHECK_THROWS_WITH_AS(make({.rank = -1}), Contains("invalid option 'rank' = -1"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.update_proj_gap = 0}), Contains("invalid option 'update_proj_gap' = 0"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.block_size = 0}), Contains("invalid option 'block_size' = 0"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.proj_type = static_cast<GaLoreProjection>(7)}), Contains("invalid option 'proj_type' = 7"),
                       lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.min_8bit_size = -1}), Contains("'min_8bit_size'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.betas = {0.9, 1.0}}), Contains("'betas[1]'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.lr = -1.0}), Contains("'lr'"), lather::invalid_argument);
  CHECK_THROWS_WITH_AS(make({.scale = -0.5}), Contains("'scale'"), lather::invalid_argument);
  make({.rank = 0});
  make({.rank = 1000});  // clipped to min(m, n)
  // Layout decisions from the options and the global shape.
  const auto side = [&](std::vector<std::int64_t> shape, GaLoreProjection p) {
    Tensors<double, M> t;
    t.add(shape, 1);
    lather::GaLoreAdamW<P, ExecSpace> opt(std::span<P>(t.params), GaLoreOptions{.rank = 2, .proj_type = p});
    return opt.layout(0).right;
  };
  CHECK(side({5, 3}, GaLoreProjection::standard));
  CHECK(side({3, 3}, GaLoreProjection::standard));  // square: right (m >= n)
  CHECK(!side({3, 5}, GaLoreProjection::standard));
  CHECK(!side({5, 3}, GaLoreProjection::reverse_standard));
  CHECK(side({3, 5}, GaLoreProjection::reverse_standard));
  CHECK(side({3, 5}, GaLoreProjection::right));
  CHECK(!side({5, 3}, GaLoreProjection::left));
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("galore: hand-computed trajectories, double", ExecSpace, galore_hand_double) {
  // The Jacobi SVD of the script and LAPACK's gesdd agree to ~1e-15; seen: <= 1.4e-15.
  impl_test_hand_computed<double, ExecSpace>(1e-12);
}
TEST_CASE_TEMPLATE_APPLY(galore_hand_double, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: hand-computed trajectories, float", ExecSpace, galore_hand_float) {
  // float SVD, moments and update against the double reference.
  impl_test_hand_computed<float, ExecSpace>(1e-6);  // seen: <= 1.7e-7
}
TEST_CASE_TEMPLATE_APPLY(galore_hand_float, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: more than 2 dims is the (shape[0], rest) matrix; strided parameters", ExecSpace,
                          galore_shapes) {
  impl_test_shapes_and_layouts<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(galore_shapes, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: an 8-bit step is dequantize, Adam, quantize", ExecSpace, galore_q8_step) {
  SUBCASE("float") { impl_test_quantized_step<float, ExecSpace>(); }
  SUBCASE("double") { impl_test_quantized_step<double, ExecSpace>(); }
}
TEST_CASE_TEMPLATE_APPLY(galore_q8_step, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: 8-bit against fp32 GaLore, and state bytes", ExecSpace, galore_q8_fp32) {
  impl_test_8bit_vs_fp32<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(galore_q8_fp32, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: state dictionary round trip continues bit for bit", ExecSpace, galore_state_dict) {
  SUBCASE("fp32 states") { impl_test_state_dict<float, ExecSpace>(false); }
  SUBCASE("8-bit states") { impl_test_state_dict<float, ExecSpace>(true); }
  SUBCASE("double") { impl_test_state_dict<double, ExecSpace>(false); }
}
TEST_CASE_TEMPLATE_APPLY(galore_state_dict, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: a NaN gradient changes nothing", ExecSpace, galore_nonfinite) {
  impl_test_nonfinite<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(galore_nonfinite, lather_test_exec_spaces);

TEST_CASE_TEMPLATE_DEFINE("galore: option errors and layout decisions", ExecSpace, galore_options) {
  impl_test_options<ExecSpace>();
}
TEST_CASE_TEMPLATE_APPLY(galore_options, lather_test_exec_spaces);

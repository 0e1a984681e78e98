// Rotates one query in place with the installed library and checks it against the float64 reference.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rotary/rope.h>

int main() {
  rotary::RopeSpec spec;
  spec.head_dim = 64;
  spec.base = 10000;
  spec.layout = rotary::RopeLayout::HalfSplit;
  const rotary::RopeFreqs freqs = spec.freqs();

  const int64_t tokens = 3, heads = 2, D = 64;
  std::vector<float> q(tokens * heads * D), ref;
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37 * double(i));
  ref = q;
  const std::vector<int64_t> positions = {0, 17, 123456};

  rotary::RopeParams p;
  p.freqs = &freqs;
  p.tokens = tokens;
  p.positions = positions.data();
  p.q_in = p.q_out = rotary::HeadsView{q.data(), heads, heads * D, D};
  rotary::rope_apply(p);
  p.q_in = p.q_out = rotary::HeadsView{ref.data(), heads, heads * D, D};
  rotary::rope_apply_reference(p);

  double worst = 0;
  for (size_t i = 0; i < q.size(); ++i) worst = std::fmax(worst, std::fabs(q[i] - ref[i]));
  std::printf("rotary consumer: max |fast - reference| = %.3g\n", worst);
  return worst < 1e-5 ? 0 : 1;
}

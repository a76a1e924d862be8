// Tensors and autograd from C++: fit y = x w + b (3 features) by gradient descent.
//
// The data come from known weights plus a little noise; the program prints the loss as it
// falls and the fitted weights, and exits non-zero unless the loss fell by 100x and the
// weights are close to the true ones (so it doubles as a smoke test of an installed library).
#include <cmath>
#include <cstdio>
#include <vector>

#include "tardelli/tardelli.h"

int main() {
  try {
    td::manual_seed(0);
    const int64_t n = 256, features = 3;
    const std::vector<float> true_w = {2.0f, -3.0f, 0.5f};
    const float true_b = 1.0f;

    // Data: x ~ N(0, 1), y = x . true_w + true_b + 0.01 noise.
    td::Tensor x = td::randn({n, features});
    td::Tensor w_true = td::from_vector(true_w, {features});
    td::Tensor y = td::sum(x * w_true, {1}) + true_b + td::randn({n}) * 0.01;

    // Parameters: leaves that require grad.
    td::Tensor w = td::zeros({features}, {.requires_grad = true});
    td::Tensor b = td::zeros({1}, {.requires_grad = true});

    const double lr = 0.1;
    double first_loss = 0.0, loss_value = 0.0;
    for (int step = 0; step <= 100; ++step) {
      td::Tensor pred = td::sum(x * w, {1}) + b;  // [n]; b broadcasts
      td::Tensor err = pred - y;
      td::Tensor loss = td::mean(err * err);
      loss_value = loss.item<float>();
      if (step == 0) first_loss = loss_value;
      if (step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, loss_value);

      loss.backward();
      {
        td::autograd::NoGradGuard no_grad;  // the update is not part of the graph
        td::add_(w, w.grad(), -lr);
        td::add_(b, b.grad(), -lr);
      }
      w.set_grad(td::Tensor());
      b.set_grad(td::Tensor());
    }

    const std::vector<float> fitted = td::to_vector<float>(w);
    const float fitted_b = td::to_vector<float>(b)[0];
    std::printf("fitted w = [%.3f, %.3f, %.3f] (true [2, -3, 0.5]), b = %.3f (true 1)\n", fitted[0],
                fitted[1], fitted[2], fitted_b);

    bool ok = loss_value < first_loss / 100.0 && std::abs(fitted_b - true_b) < 0.05;
    for (size_t i = 0; i < true_w.size(); ++i) ok = ok && std::abs(fitted[i] - true_w[i]) < 0.05;
    std::printf("%s: loss %.6f -> %.6f\n", ok ? "OK" : "FAILED", first_loss, loss_value);
    return ok ? 0 : 1;
  } catch (const td::Error& e) {
    std::fprintf(stderr, "tardelli error: %s\n", e.what());
    return 2;
  }
}

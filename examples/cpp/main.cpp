// vla_infer: run an exported vlastack policy (``vla export``) without Python.
//
//   vla_infer policy.pt2|policy.ts inputs.txt [actions.bin]
//
// inputs.txt has one line per input tensor, in the model's input order:
//   name dtype ndim d0 d1 ... byte_offset byte_count
// and the raw bytes live in inputs.bin next to it (see vlastack.infer.export.write_raw_inputs).
// Prints the actions [B, H, A] (env units: normalization is inside the graph) and, if asked,
// writes them as raw little-endian float32.
#include <torch/script.h>
#include <torch/torch.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

torch::Dtype parse_dtype(const std::string& s) {
  if (s == "uint8") return torch::kUInt8;
  if (s == "bool") return torch::kBool;
  if (s == "int64") return torch::kInt64;
  if (s == "float32") return torch::kFloat32;
  throw std::runtime_error("unsupported dtype in inputs.txt: " + s);
}

std::vector<torch::Tensor> read_inputs(const std::string& txt_path) {
  std::ifstream txt(txt_path);
  if (!txt) throw std::runtime_error("cannot open " + txt_path);
  std::string bin_path = txt_path.substr(0, txt_path.find_last_of('/') + 1) + "inputs.bin";
  if (txt_path.find('/') == std::string::npos) bin_path = "inputs.bin";
  std::ifstream bin(bin_path, std::ios::binary);
  if (!bin) throw std::runtime_error("cannot open " + bin_path);
  std::vector<torch::Tensor> inputs;
  std::string line;
  while (std::getline(txt, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string name, dtype;
    int64_t ndim = 0, offset = 0, count = 0;
    ls >> name >> dtype >> ndim;
    std::vector<int64_t> shape(ndim);
    for (auto& d : shape) ls >> d;
    ls >> offset >> count;
    if (!ls) throw std::runtime_error("malformed line in inputs.txt: " + line);
    auto t = torch::empty(shape, torch::TensorOptions().dtype(parse_dtype(dtype)));
    if (static_cast<int64_t>(t.nbytes()) != count)
      throw std::runtime_error(name + ": byte count does not match shape and dtype");
    bin.seekg(offset);
    bin.read(static_cast<char*>(t.data_ptr()), count);
    if (!bin) throw std::runtime_error(name + ": inputs.bin is too short");
    inputs.push_back(t);
  }
  return inputs;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " policy.pt2|policy.ts inputs.txt [actions.bin]\n";
    return 2;
  }
  const std::string artifact = argv[1];
  try {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> inputs = read_inputs(argv[2]);
    torch::Tensor actions;
    auto t0 = std::chrono::steady_clock::now();
    double run_ms = 0;
    if (ends_with(artifact, ".pt2")) {
      torch::inductor::AOTIModelPackageLoader loader(artifact);
      auto t1 = std::chrono::steady_clock::now();
      actions = loader.run(inputs)[0];
      run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    } else {
      torch::jit::script::Module module = torch::jit::load(artifact);
      std::vector<torch::jit::IValue> args(inputs.begin(), inputs.end());
      auto t1 = std::chrono::steady_clock::now();
      actions = module.forward(args).toTensor();
      run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    }
    double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    actions = actions.contiguous().to(torch::kFloat32);
    std::cerr << "load+run " << total_ms << " ms, run " << run_ms << " ms\n";
    std::cout << "actions " << actions.sizes() << "\n";
    auto a = actions.accessor<float, 3>();
    for (int64_t b = 0; b < a.size(0); ++b)
      for (int64_t h = 0; h < a.size(1); ++h) {
        for (int64_t d = 0; d < a.size(2); ++d) std::printf("%s%.6f", d ? " " : "", a[b][h][d]);
        std::printf("\n");
      }
    if (argc > 3) {
      std::ofstream out(argv[3], std::ios::binary);
      out.write(static_cast<const char*>(actions.data_ptr()), actions.nbytes());
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

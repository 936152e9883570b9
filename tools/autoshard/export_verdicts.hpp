#pragma once
// Whether `autoshard export` writes a plan file in each format, as `plan` reports beside the
// plan it wrote: the exporters run as the export command runs them (its defaults: the tp axis
// it picks, transformers 5), their refusals kept, nothing written.
#include <autoshard/pass/export.hpp>
#include <autoshard/pass/export_megatron.hpp>

#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace autoshard::tool {

/// One format: whether the export writes it, and if not, why (the operators it cannot
/// express, or the one reason of a refusal that names none).
struct export_verdict {
  std::string target;  ///< as `export --to` names it
  bool ok = false;
  std::vector<std::string> problems;
  std::vector<std::string> notes;  ///< what it does otherwise than the plan, or leaves to the user
};

/// The verdict of `export --plan FILE --to T` for each T.
inline std::vector<export_verdict> export_verdicts(const std::string& file) {
  std::vector<export_verdict> out;
  std::optional<loaded_plan> loaded;
  std::string unread;
  try {
    loaded = load_plan(file);
  } catch (const autoshard::error& e) {
    unread = e.what();  // every format refuses it alike
  }
  for (const char* target : {"dtensor", "hf-tp-plan", "megatron"}) {
    export_verdict v{target, false, {}, {}};
    if (!loaded) {
      v.problems.push_back(unread);
      out.push_back(std::move(v));
      continue;
    }
    const loaded_plan& lp = *loaded;
    try {
      if (v.target == "megatron") {
        const megatron_export e = export_megatron(lp);
        v.problems = e.problems;
        v.notes = e.notes;
        if (v.problems.empty()) (void)megatron_arguments(e);  // its own refusals, as the command meets them
      } else {
        export_options eo;
        eo.target = v.target == "dtensor" ? export_target::dtensor : export_target::hf;
        const tp_export e = export_tensor_parallel(lp, eo);
        v.problems = e.problems;
        v.notes = e.notes;
        if (v.problems.empty()) (void)(eo.target == export_target::dtensor ? to_dtensor_plan(e) : to_hf_tp_plan(e));
      }
      v.ok = v.problems.empty();
    } catch (const autoshard::error& e) {
      if (v.problems.empty()) v.problems.push_back(e.what());
    }
    out.push_back(std::move(v));
  }
  return out;
}

/// {"dtensor": {"exports": true, "problems": [], "notes": [...]}, ...}
inline nlohmann::json export_verdicts_json(const std::vector<export_verdict>& vs) {
  nlohmann::json j = nlohmann::json::object();
  for (const export_verdict& v : vs) j[v.target] = {{"exports", v.ok}, {"problems", v.problems}, {"notes", v.ok ? v.notes : std::vector<std::string>{}}};
  return j;
}

/// The terminal lines: each format, yes (and how many notes) or why not (the first problem, and
/// how many more).
inline void print_export_verdicts(const std::vector<export_verdict>& vs, const std::string& plan_file) {
  std::cout << "\nexports (autoshard export --plan " << escaped_text(plan_file) << " --to FORMAT)\n";
  for (const export_verdict& v : vs) {
    std::cout << "  " << std::left << std::setw(12) << v.target << std::right;
    if (v.ok) {
      std::cout << "yes";
      if (!v.notes.empty()) std::cout << ", with " << count_noun(v.notes.size(), "note") << " (the export prints them)";
      std::cout << "\n";
      continue;
    }
    std::string first = v.problems.empty() ? std::string("refused") : v.problems.front();
    if (const std::size_t nl = first.find('\n'); nl != std::string::npos) first.resize(nl);  // a refusal's first line
    std::cout << "no: " << escaped_text(first);
    if (v.problems.size() > 1) std::cout << " (and " << v.problems.size() - 1 << " more)";  // operators, or other reasons
    std::cout << "\n";
  }
}

}  // namespace autoshard::tool

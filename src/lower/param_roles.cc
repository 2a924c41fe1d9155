#include "param_roles.h"

#include <string>
#include <unordered_map>

namespace vramscope::lower {

std::vector<ParamRole> WeightRoles(const std::vector<ParamTensor>& params) {
  std::unordered_map<std::string, ParamRole> weight_role;  // module -> its weight's role
  for (const ParamTensor& pt : params) {
    if (pt.role != ParamRole::kBias && !pt.name.ends_with(".bias"))
      weight_role.emplace(pt.module, pt.role);
  }
  std::vector<ParamRole> roles;
  roles.reserve(params.size());
  for (const ParamTensor& pt : params) {
    ParamRole r = pt.role;
    if (r == ParamRole::kBias) {
      auto it = weight_role.find(pt.module);
      if (it != weight_role.end()) r = it->second;
    }
    roles.push_back(r);
  }
  return roles;
}

}  // namespace vramscope::lower

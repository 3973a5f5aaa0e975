#include "scheduler/fair_share.h"

#include <algorithm>

#include "common/check.h"

namespace kvserve::scheduler {

std::vector<int64_t> WaterFill(const std::vector<int64_t>& demand,
                               const std::vector<int64_t>& weight,
                               int64_t budget) {
  const size_t n = demand.size();
  std::vector<int64_t> out(n, 0);
  std::vector<bool> open(n);
  for (size_t i = 0; i < n; ++i) open[i] = demand[i] > 0;
  while (budget > 0) {
    int64_t total_weight = 0;
    for (size_t i = 0; i < n; ++i) total_weight += open[i] ? weight[i] : 0;
    if (total_weight == 0) break;
    // Demands that fit their share are met in full; the rest is split again.
    bool capped = false;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      const int64_t left = demand[i] - out[i];
      if (left * total_weight <= budget * weight[i]) {
        out[i] += left;
        budget -= left;
        open[i] = false;
        capped = true;
      }
    }
    if (capped) continue;
    int64_t given = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      const int64_t share = budget * weight[i] / total_weight;
      out[i] += share;
      given += share;
    }
    budget -= given;
    // Remainders: one each, in index order (no open demand is met here:
    // each was above its share).
    for (size_t i = 0; i < n && budget > 0; ++i) {
      if (open[i] && out[i] < demand[i]) {
        ++out[i];
        --budget;
      }
    }
    break;
  }
  return out;
}

int32_t FairShare::Join(const TenantPolicy& policy) {
  auto [it, fresh] =
      ids_.try_emplace(policy.name, static_cast<int32_t>(tenants_.size()));
  if (fresh) {
    tenants_.emplace_back();
    tenants_.back().name = policy.name;
  }
  Tenant& t = tenants_[it->second];
  t.weight = std::max(policy.weight, 1);
  t.max_running = policy.max_running;
  ++t.live;
  return it->second;
}

void FairShare::Leave(int32_t tenant) {
  Tenant& t = tenants_[tenant];
  KV_CHECK(t.live > 0, "tenant ", t.name, " has no live request");
  --t.live;
}

void FairShare::AddRunningSeats(int32_t tenant, int32_t seats) {
  tenants_[tenant].running_seats += seats;
  running_seats_ += seats;
  KV_DCHECK(tenants_[tenant].running_seats >= 0 && running_seats_ >= 0);
}

void FairShare::Enqueue(Request* r) {
  KV_CHECK(tenants_[r->tenant_id_].waiting.emplace(r->queue_key_, r).second,
           "request ", r->id(), " queued twice in its tenant");
  waiting_seats_ += r->seats();
}

void FairShare::Dequeue(const Request* r) {
  KV_CHECK(tenants_[r->tenant_id_].waiting.erase(r->queue_key_) == 1,
           "request ", r->id(), " not queued in its tenant");
  waiting_seats_ -= r->seats();
}

int64_t FairShare::ActiveWeight() const {
  int64_t w = 0;
  for (const Tenant& t : tenants_) w += t.live > 0 ? t.weight : 0;
  return w;
}

bool FairShare::AtOrAboveShare(int32_t tenant) const {
  const Tenant& t = tenants_[tenant];
  // running / max_num_seqs >= weight / active weight, in integers.
  return int64_t{t.running_seats} * ActiveWeight() >=
         int64_t{max_num_seqs_} * t.weight;
}

bool FairShare::UnderCap(int32_t tenant, int32_t seats) const {
  const Tenant& t = tenants_[tenant];
  return t.max_running <= 0 || t.running_seats + seats <= t.max_running;
}

Request* FairShare::Candidate() const {
  Request* under = nullptr;
  Request* rest = nullptr;
  for (size_t id = 0; id < tenants_.size(); ++id) {
    const Tenant& t = tenants_[id];
    if (t.waiting.empty()) continue;
    Request* head = t.waiting.begin()->second;
    if (!UnderCap(static_cast<int32_t>(id), head->seats())) continue;
    Request*& best = AtOrAboveShare(static_cast<int32_t>(id)) ? rest : under;
    if (best == nullptr || head->queue_key_ < best->queue_key_) best = head;
  }
  return under != nullptr ? under : rest;
}

std::vector<int32_t> FairShare::SplitPrefill(const std::vector<int32_t>& tenant,
                                             const std::vector<int32_t>& want,
                                             int32_t budget) const {
  // Tenants in order of first appearance, with their summed demand.
  std::vector<int32_t> ids;
  std::vector<int64_t> demand;
  std::vector<int64_t> weight;
  absl::flat_hash_map<int32_t, size_t> slot;
  for (size_t i = 0; i < tenant.size(); ++i) {
    auto [it, fresh] = slot.try_emplace(tenant[i], ids.size());
    if (fresh) {
      ids.push_back(tenant[i]);
      demand.push_back(0);
      weight.push_back(tenants_[tenant[i]].weight);
    }
    demand[it->second] += want[i];
  }
  std::vector<int64_t> left = WaterFill(demand, weight, budget);
  std::vector<int32_t> out(tenant.size(), 0);
  for (size_t i = 0; i < tenant.size(); ++i) {
    int64_t& l = left[slot.at(tenant[i])];
    out[i] = static_cast<int32_t>(std::min<int64_t>(want[i], l));
    l -= out[i];
  }
  return out;
}

}  // namespace kvserve::scheduler

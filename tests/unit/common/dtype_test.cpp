// The dtype table (common/dtype.h).
#include "common/dtype.h"

#include <set>
#include <string>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("LookupDType knows PyTorch's names, sizes and safetensors spellings", "[dtype]") {
  struct Expect {
    std::string_view name;
    uint32_t size;
    std::string_view safetensors;
  };
  for (const Expect& e :
       {Expect{"float32", 4, "F32"}, Expect{"float16", 2, "F16"}, Expect{"bfloat16", 2, "BF16"},
        Expect{"float64", 8, "F64"}, Expect{"int8", 1, "I8"}, Expect{"uint8", 1, "U8"},
        Expect{"int16", 2, "I16"}, Expect{"int32", 4, "I32"}, Expect{"int64", 8, "I64"},
        Expect{"bool", 1, "BOOL"}, Expect{"float8_e4m3fn", 1, "F8_E4M3"},
        Expect{"float8_e5m2", 1, "F8_E5M2"}}) {
    INFO("dtype " << e.name);
    auto d = LookupDType(e.name);
    REQUIRE_OK(d);
    CHECK(d->name == e.name);
    CHECK(d->element_size == e.size);
    CHECK(d->safetensors == e.safetensors);
  }
}

TEST_CASE("AllDTypes: unique names and spellings, each found by LookupDType", "[dtype]") {
  const auto all = AllDTypes();
  REQUIRE(all.size() >= 12);
  std::set<std::string_view> names, spellings;
  for (const DTypeInfo& d : all) {
    INFO("dtype " << d.name);
    CHECK(names.insert(d.name).second);
    CHECK(spellings.insert(d.safetensors).second);
    CHECK(d.element_size >= 1);
    CHECK(d.element_size <= 8);
    CHECK((d.element_size & (d.element_size - 1)) == 0);  // a power of two
    auto found = LookupDType(d.name);
    REQUIRE_OK(found);
    CHECK(found->element_size == d.element_size);
    CHECK(found->safetensors == d.safetensors);
  }
}

TEST_CASE("AllDTypes order is stable between calls", "[dtype]") {
  const auto a = AllDTypes();
  const auto b = AllDTypes();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].name == b[i].name);
}

TEST_CASE("LookupDType rejects unknown names, naming the name and the known ones", "[dtype]") {
  for (std::string_view bad :
       {"", "float", "Float32", "torch.float32", "F32", "float32 ", "complex64"}) {
    INFO("dtype \"" << bad << "\"");
    auto d = LookupDType(bad);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(d.status().message(), Contains("'" + std::string(bad) + "'"));
    CHECK_THAT(d.status().message(), Contains("bfloat16"));
  }
}

}  // namespace
}  // namespace ckpt

// json.hpp: values round-trip exactly (int64 extremes, shortest doubles, escapes, UTF-8), output
// is deterministic, and every kind of malformed text is an Error naming the source and byte.
#include "common.hpp"

#include <dpml/checkpoint/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

using namespace dpml;
using checkpoint::Json;

TEST_CASE("json: values round-trip through dump and parse", "[checkpoint][json]") {
  Json v = Json::object();
  v.set("int_max", std::numeric_limits<std::int64_t>::max())
      .set("int_min", std::numeric_limits<std::int64_t>::min())
      .set("zero", 0)
      .set("tenth", 0.1)
      .set("big", 1e300)
      .set("small", -2.5e-7)
      .set("one_double", 1.0)
      .set("flags", Json(Json::Array{true, false, nullptr}))
      .set("text", "quote \" backslash \\ slash / tab \t newline \n ctl \x01 é")
      .set("nested", Json(Json::Object{{"a", Json(Json::Array{Json::array(), Json::object()})}}));
  const std::string text = v.dump();
  const Json back = Json::parse(text, "round trip");
  CHECK(back == v);
  CHECK(back.dump() == text);  // deterministic
  CHECK(back.at("int_max").as_int() == std::numeric_limits<std::int64_t>::max());
  CHECK(back.at("int_min").as_int() == std::numeric_limits<std::int64_t>::min());
  CHECK(back.at("tenth").as_double() == 0.1);
  CHECK(back.at("one_double").is_double());  // "1.0" stays a double
  CHECK(back.at("zero").is_int());
  CHECK(back.at("text").as_string() == v.at("text").as_string());
  CHECK(text.find("\\u0001") != std::string::npos);
  // Key order is insertion order.
  CHECK(text.rfind("{\"int_max\":9223372036854775807,\"int_min\":-9223372036854775808,", 0) == 0);
}

TEST_CASE("json: escapes and whitespace on input", "[checkpoint][json]") {
  const Json v = Json::parse(" { \"a\" : [ 1 , -0.5e1 , \"\\u00e9\\ud83d\\ude00\\/\\b\\f\\r\" ] }\n", "input");
  const auto& a = v.at("a").as_array();
  REQUIRE(a.size() == 3);
  CHECK(a[0].as_int() == 1);
  CHECK(a[1].as_double() == -5.0);
  CHECK(a[2].as_string() == "\xc3\xa9\xf0\x9f\x98\x80/\b\f\r");
  CHECK(Json::parse("-0", "x").as_int() == 0);
  CHECK(Json::parse("1E2", "x").as_double() == 100.0);
}

TEST_CASE("json: malformed text is an Error naming the source and the byte", "[checkpoint][json]") {
  const char* bad[] = {"",           "{",          "[1,]",        "{\"a\":1,}",  "01",         "1.",
                       "-",          "1e",         "\"\\x\"",     "\"a\nb\"",    "{\"a\":1,\"a\":2}",
                       "nul",        "[1] x",      "9223372036854775808",      "\"\\ud800\"", "\"\\udc00\"",
                       "{a:1}",      "[1 2]",      "\"abc",       "1e999",      "'a'",        "[1,,2]"};
  for (const char* text : bad) {
    CAPTURE(text);
    const std::string e = test::error_of([&] { Json::parse(text, "bad.json"); });
    CHECK(test::contains(e, "malformed JSON in 'bad.json' at byte"));
  }
  const std::string deep(600, '[');
  CHECK(test::contains(test::error_of([&] { Json::parse(deep, "deep.json"); }), "nesting deeper than 512"));
  CHECK(test::contains(test::error_of([] { Json::parse("{\"a\":1,\"a\":2}", "d.json"); }), "duplicate key \"a\""));
}

TEST_CASE("json: type errors and non-finite numbers", "[checkpoint][json]") {
  const Json v = Json::parse("{\"n\":\"text\"}", "x");
  CHECK(test::contains(test::error_of([&] { (void)v.at("n").as_int(); }), "expected an integer, found string"));
  CHECK(test::contains(test::error_of([&] { (void)v.at("m"); }), "missing key \"m\""));
  CHECK(test::contains(test::error_of([] { (void)Json(std::nan("")).dump(); }), "non-finite"));
}

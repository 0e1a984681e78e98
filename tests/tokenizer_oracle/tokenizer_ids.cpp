// tests/tokenizer_oracle/tokenizer_ids.cpp: our side of the tokenizer oracle (test_tokenizer_oracle.sh). For each
// text of a JSON array, prints what rotary's tokenizer gives: encode (no BOS/EOS), encode_for_model, the decode of the
// encode ids and the decode of each id alone, as one JSON object per line, so that oracle.mjs can set it beside Hugging Face Tokenizers.js.
//
// usage: tokenizer_ids <model dir (tokenizer.json [+ tokenizer_config.json])> <texts.json>
// Decoded text that is not valid UTF-8 is printed with U+FFFD in place of the bad bytes (as Hugging Face decodes)
// and "decode_utf8": false, so that the comparison can tell the two apart.
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "rotary_tokenizers/tokenizer.h"

namespace {

bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <model dir> <texts.json>\n", argv[0]);
    return 2;
  }
  try {
    const auto tokenizer = rotary::tokenizers::load_tokenizer(argv[1]);
    std::ifstream in(argv[2]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[2]);
    const nlohmann::json texts = nlohmann::json::parse(in);
    for (const auto& text_json : texts) {
      const std::string text = text_json.get<std::string>();
      nlohmann::json out;
      out["ids"] = tokenizer->encode(text);
      out["ids_for_model"] = tokenizer->encode_for_model(text);
      const std::string decoded = tokenizer->decode(out["ids"].get<std::vector<int64_t>>());
      out["decode"] = decoded;
      out["decode_utf8"] = valid_utf8(decoded);
      // Each token alone through the decoder (a byte token alone is not valid UTF-8: compared only where it is).
      out["pieces"] = nlohmann::json::array();
      out["pieces_utf8"] = nlohmann::json::array();
      for (const int64_t id : out["ids"].get<std::vector<int64_t>>()) {
        const std::string piece = tokenizer->decode({id});
        out["pieces"].push_back(piece);
        out["pieces_utf8"].push_back(valid_utf8(piece));
      }
      std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    std::cout.flush();
    return std::cout ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_ids: %s\n", e.what());
    return 1;
  }
}

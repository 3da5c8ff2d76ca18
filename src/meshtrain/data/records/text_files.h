// Text as the data path accepts it, shared by corpus.h's text corpora and the record reader: UTF-8 checks,
// and one text file read as one document under the rules below.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace meshtrain {

// The UTF-8 sequence starting at `i`: its length, 0 if invalid (a bad lead or continuation byte, an overlong
// form, a surrogate, beyond U+10FFFF), or -1 if cut off by the end of `bytes`.
int utf8_sequence(std::string_view bytes, size_t i);
// The offset of the first byte of `text` that does not start a complete valid UTF-8 sequence, or npos.
size_t invalid_utf8_offset(std::string_view text);

// Every byte of a text file as one document. An unreadable or empty file, or a binary one (a NUL byte or
// invalid UTF-8 in the first 64 KiB; later bytes are not checked, so a large file costs one read), is a
// MeshError naming the file; the hints name `path_setting` ("--corpus", "dataset_path"), the setting that
// pointed at it.
std::string read_text_document(const std::string& path, const std::string& path_setting);

}  // namespace meshtrain

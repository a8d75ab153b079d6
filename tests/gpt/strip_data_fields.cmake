# Copies checkpoint DIR to OUT without the data.* entries of its config and without the manifest's
# own checksum: a checkpoint as written before either was recorded.   cmake -DDIR=<step dir> -DOUT=<step dir> -P strip_data_fields.cmake
file(REMOVE_RECURSE ${OUT})
file(COPY ${DIR}/ DESTINATION ${OUT})
file(READ ${OUT}/manifest.json manifest)
string(JSON manifest REMOVE "${manifest}" config data.path)
string(JSON manifest REMOVE "${manifest}" config data.tokens)
string(JSON manifest ERROR_VARIABLE no_checksum REMOVE "${manifest}" manifest_crc32)
file(WRITE ${OUT}/manifest.json "${manifest}")

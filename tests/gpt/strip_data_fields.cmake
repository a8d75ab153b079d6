# Copies checkpoint DIR to OUT without the data.* entries of its config: a checkpoint as written
# before they were recorded.   cmake -DDIR=<step dir> -DOUT=<step dir> -P strip_data_fields.cmake
file(REMOVE_RECURSE ${OUT})
file(COPY ${DIR}/ DESTINATION ${OUT})
file(READ ${OUT}/manifest.json manifest)
string(JSON manifest REMOVE "${manifest}" config data.path)
string(JSON manifest REMOVE "${manifest}" config data.tokens)
file(WRITE ${OUT}/manifest.json "${manifest}")

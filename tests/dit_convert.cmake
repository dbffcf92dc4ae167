# tools/convert_dit.py: original DiT .pt checkpoints and diffusers DiT folders (sharded, BF16)
# built from the bundled DiT convert back to its tensors bit for bit and evaluate to the same
# loss; bad input stops with a message and exit status 2 (tests/dit/convert_dit_test.sh).
# Skipped without PyTorch, numpy or h5py in /usr/bin/python3.
add_test(NAME dit_convert
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dit/convert_dit_test.sh $<TARGET_FILE:turbozero> ${CMAKE_SOURCE_DIR})
set_tests_properties(dit_convert PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 ENVIRONMENT "${TZ_TEST_ENV}"
  LABELS "e2e")

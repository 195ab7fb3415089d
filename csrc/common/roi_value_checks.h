// Whether the CUDA RoI ops check the rois' values (batch index in range, finite coordinates,
// level in range) before pooling. The check costs one host wait per call (common/cuda/roi_checks.cuh);
// callers whose rois are made by code, not typed by a user (the detector's RoI extractors, whose
// rois come from bbox2roi), switch it off for their calls so that a training step never waits.
// Without the check a bad row pools zeros (the kernels' own guards), as inside a CUDA graph.
// Per thread: the switch covers the calls of the thread that set it.
#pragma once

namespace redet {

bool roi_value_checks_enabled();
// Returns the previous setting.
bool set_roi_value_checks_enabled(bool enabled);

}  // namespace redet

"""What a failing item prints: fxverify's finding and the user's own log, none of torch's debug logging."""

from __future__ import annotations

import re

import pytest

# torch's loggers do not propagate as torch sets them up; a user's logging setup may make them, and
# with TORCH_TRACE set torch.__trace keeps a handler and logs each trace_structured call at DEBUG
PROPAGATING_TORCH_LOGS = """
import logging

logging.getLogger("torch").propagate = True
logging.getLogger("torch.__trace").propagate = True
logging.getLogger("torch.__trace").addHandler(logging.NullHandler())
"""

PASSES = """
import logging

from tests.aten_passes import conv_bn_fold_forgets_mean
from tests.mutations import bn_fold_ignores_running_mean


def symbolic_fold(gm):
    logging.getLogger("my_pass").debug("folding")
    return bn_fold_ignores_running_mean(gm)


def aten_fold(gm):
    logging.getLogger("my_pass").debug("folding")
    return conv_bn_fold_forgets_mean(gm)
"""


@pytest.mark.parametrize(("capture", "transform"), [("symbolic_trace", "symbolic_fold"), ("export", "aten_fold")])
def test_a_failing_item_reports_the_users_log_but_not_torchs_debug_log(pytester, capture, transform):
    pytester.makeconftest(PROPAGATING_TORCH_LOGS)
    pytester.makepyfile(passes=PASSES)
    result = pytester.runpytest("-p", "no:cacheprovider", "--log-level=DEBUG", "--fxverify", f"passes.py:{transform}",
                                "--fxverify-corpus=edge_conv_bn_head", f"--fxverify-capture={capture}",
                                "--fxverify-checks=numerics")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*fxverify numerics check failed*", "*Captured log call*", "DEBUG *my_pass:passes.py:* folding"])
    assert not re.search(r"(?m)^(DEBUG|INFO) +torch", result.stdout.str()), result.stdout.str()

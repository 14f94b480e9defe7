"""pdsim: discrete-event simulation of prefill/decode-disaggregated LLM serving.

    >>> import pdsim
    >>> res = pdsim.run("scenarios/healthy.yaml")
    >>> res.summary["output_throughput_tok_s"], res.requests.head()
"""

from pdsim.explore import Exploration, explore
from pdsim.scenario import Scenario, ScenarioError, load
from pdsim.sim import Result, run
from pdsim.sweep import sweep
from pdsim.whatif import WhatIf, whatif

__all__ = ["Exploration", "Result", "Scenario", "ScenarioError", "WhatIf", "explore", "load",
           "run", "sweep", "whatif"]
__version__ = "0.1.0"

"""Editing methods in one home: a registry with a hyperparameter dataclass per method and the update
rules, used by the toy LM (:mod:`factkernels.transformer.editing`) and real models (:mod:`factkernels.hf`).

    from factkernels import editing
    editing.method_names(real_lm=True)             # ("rome", "memit", "alphaedit", "grace", "wise", "ours")
    hp = editing.hparams("rome", num_layers=30, mlp_width=1536)
    W2 = editing.update_weight(hp, W, keys, values, C)
"""

from .methods import (METHODS, TUNED, AlphaEditHparams, GRACEHparams, InsertionHparams, KeyStatistics,
                      MEMITHparams, Method, MLPSwapHparams, ResidualStep, ROMEHparams, WISEHparams, as_dict,
                      get_method, hparams, method_names)
from .rules import (alphaedit_update, memit_update, null_space_projector, nullspace_threshold, rome_update,
                    update_weight)
from .side_memory import GraceCodebook, wise_activation_distance, wise_margin_loss

__all__ = ["METHODS", "TUNED", "Method", "method_names", "get_method", "hparams", "as_dict", "ResidualStep",
           "KeyStatistics", "ROMEHparams",
           "MEMITHparams", "AlphaEditHparams", "GRACEHparams", "WISEHparams", "MLPSwapHparams", "InsertionHparams",
           "rome_update", "memit_update", "null_space_projector", "nullspace_threshold", "alphaedit_update",
           "update_weight", "GraceCodebook", "wise_activation_distance", "wise_margin_loss"]

"""Pure partitioning and backend delegation over texir's frozen IR: `lower_decomposed` (a Program
already in core ATen, without torch) and `to_backend` (ExecuTorch's three seed forms). `texir.lower`
(texir.orchestrate) is the entry point from an ExportedProgram."""

from texir.lowering.api import to_backend
from texir.lowering.backend import (
    Backend,
    PreprocessResult,
    get_backend,
    named_data_entry,
    register_backend,
    registered_backends,
)
from texir.lowering.capability import maximal_partitions
from texir.lowering.lower import lower_decomposed
from texir.lowering.report import PHASES, DelegateReport, Lowered, LowerReport, Phase, Retrace, TurnedDown, UndelegatedNode
from texir.lowering.delegate import (
    LoweringReport,
    NodeOrder,
    PartitionSummary,
    PreprocessOptions,
)
from texir.lowering.preprocess import CACHE_DIR_ENV, PreprocessCache, default_cache
from texir.lowering.errors import (
    BackendError,
    BackendPreprocessError,
    BackendRegistrationError,
    DelegateClaimedError,
    KeptOpNotDelegatedError,
    MissingDelegationSpecError,
    MutationOutsidePartitionError,
    NonConvexPartitionError,
    PartitionerArgumentError,
    PartitionerError,
    PlanArgumentError,
    PlanError,
    SharedConstantError,
    SplitMultiOutputError,
    SubgraphAttrError,
    TaggedPlaceholderError,
    UnknownBackendError,
    UnknownNodeError,
)
from texir.lowering.lowered import delegate_wrapper_program, get_lowered_submodules
from texir.lowering.partitioners import (
    NodeContext,
    NodeFilter,
    NodeGroupPartitioner,
    OpSupportPartitioner,
    WholeProgramPartitioner,
    tag_constants,
    tag_mutated_buffers,
)
from texir.lowering.plan import (
    CheckedPlan,
    DelegationSpec,
    Partitioner,
    PartitionPlan,
    validate_plan,
)

__all__ = [
    "CACHE_DIR_ENV",
    "Backend",
    "CheckedPlan",
    "BackendError",
    "BackendPreprocessError",
    "BackendRegistrationError",
    "DelegateClaimedError",
    "KeptOpNotDelegatedError",
    "DelegationSpec",
    "DelegateReport",
    "LowerReport",
    "Lowered",
    "LoweringReport",
    "PHASES",
    "Phase",
    "Retrace",
    "TurnedDown",
    "UndelegatedNode",
    "NodeOrder",
    "MissingDelegationSpecError",
    "MutationOutsidePartitionError",
    "NodeContext",
    "NodeFilter",
    "NodeGroupPartitioner",
    "NonConvexPartitionError",
    "OpSupportPartitioner",
    "PartitionPlan",
    "PartitionSummary",
    "PreprocessCache",
    "PreprocessOptions",
    "Partitioner",
    "PartitionerArgumentError",
    "PartitionerError",
    "PlanArgumentError",
    "PlanError",
    "PreprocessResult",
    "SharedConstantError",
    "SplitMultiOutputError",
    "SubgraphAttrError",
    "TaggedPlaceholderError",
    "UnknownBackendError",
    "UnknownNodeError",
    "WholeProgramPartitioner",
    "delegate_wrapper_program",
    "get_backend",
    "get_lowered_submodules",
    "default_cache",
    "lower_decomposed",
    "maximal_partitions",
    "named_data_entry",
    "register_backend",
    "registered_backends",
    "tag_constants",
    "tag_mutated_buffers",
    "to_backend",
    "validate_plan",
]

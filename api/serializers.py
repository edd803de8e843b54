"""Serializers of the API: read-only output, and strict input serializers that refuse any key but their one or two
fields with 400, so no client can set a server-owned field (tenant, state, score, VM name). The agent token is
never serialized."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from rest_framework import serializers

from labs.models import Attempt, Check, Lab
from labs.selectors import attempt_can_extend
from labs.sizes import guest_resources
from portal.models import AuditEvent, Course, User
from portal.timezones import person_time_zone, validate_time_zone


class StrictInputSerializer(serializers.Serializer):
    """Refuses keys it does not declare (mass assignment: ``tenant``, ``student``, ``state``...)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: [_("This field cannot be set.")] for name in unknown})
        return super().to_internal_value(data)


class PersonSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    username = serializers.CharField(read_only=True)
    full_name = serializers.CharField(read_only=True)


class MeSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name", read_only=True, allow_null=True, default=None)
    time_zone = serializers.SerializerMethodField(
        help_text="The IANA zone your pages show times in: your own if you chose one, else your institution's, else "
        "the portal's default. The API itself answers in UTC."
    )

    class Meta:
        model = User
        fields = ["id", "username", "full_name", "email", "tenant", "time_zone"]
        read_only_fields = fields

    def get_time_zone(self, user: User) -> str:
        return str(person_time_zone(user, user.tenant))


class CourseSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="Your role in the course: instructor, ta or student.")

    class Meta:
        model = Course
        fields = ["id", "code", "title", "term", "role"]
        read_only_fields = fields

    def get_role(self, course: Course) -> str | None:
        return self.context.get("roles", {}).get(course.id)


class StudentCheckSerializer(serializers.ModelSerializer):
    """What a student sees of a check: never the command or the expectation, which would give the answer."""

    class Meta:
        model = Check
        fields = ["id", "order", "title", "points"]
        read_only_fields = fields


class StaffCheckSerializer(serializers.ModelSerializer):
    class Meta:
        model = Check
        fields = [
            "id",
            "order",
            "title",
            "points",
            "command",
            "expected_exit_code",
            "stdout_match",
            "stdout_pattern",
            "timeout_s",
            "hint",
        ]
        read_only_fields = fields


class LabSerializer(serializers.ModelSerializer):
    vcpus = serializers.SerializerMethodField()
    memory_mib = serializers.SerializerMethodField()

    class Meta:
        model = Lab
        fields = [
            "id",
            "course",
            "title",
            "instructions",
            "size",
            "vcpus",
            "memory_mib",
            "time_limit_minutes",
            "idle_stop_minutes",
            "opens_at",
            "due_at",
            "late_penalty_percent_per_day",
            "late_cutoff_at",
            "attempt_limit",
            "grade_policy",
            "is_open",
        ]
        read_only_fields = fields

    def get_vcpus(self, lab: Lab) -> int:
        return guest_resources(lab.size).vcpus

    def get_memory_mib(self, lab: Lab) -> int:
        return guest_resources(lab.size).memory_mib


class StudentLabDetailSerializer(LabSerializer):
    checks = StudentCheckSerializer(many=True, read_only=True)

    class Meta(LabSerializer.Meta):
        fields = [*LabSerializer.Meta.fields, "checks"]
        read_only_fields = fields


class StaffLabDetailSerializer(LabSerializer):
    checks = StaffCheckSerializer(many=True, read_only=True)

    class Meta(LabSerializer.Meta):
        fields = [*LabSerializer.Meta.fields, "image", "nested_virtualization", "extra_cloud_init", "checks"]
        read_only_fields = fields


class AttemptTimestampsSerializer(serializers.Serializer):
    requested = serializers.DateTimeField(source="requested_at", read_only=True)
    provisioned = serializers.DateTimeField(source="provisioned_at", read_only=True, allow_null=True)
    pending = serializers.DateTimeField(source="pending_at", read_only=True, allow_null=True)
    scheduling = serializers.DateTimeField(source="scheduling_at", read_only=True, allow_null=True)
    scheduled = serializers.DateTimeField(source="scheduled_at", read_only=True, allow_null=True)
    vmi_running = serializers.DateTimeField(source="vmi_running_at", read_only=True, allow_null=True)
    agent_ready = serializers.DateTimeField(source="agent_ready_at", read_only=True, allow_null=True)
    stopping = serializers.DateTimeField(source="stopping_at", read_only=True, allow_null=True)
    ended = serializers.DateTimeField(source="ended_at", read_only=True, allow_null=True)


class StaffViewSerializer(serializers.ModelSerializer):
    """Staff-only values are filled in only for objects of a course where the reader is staff
    (``context["staff_course_ids"]``); everyone else reads null there."""

    staff_only: tuple[str, ...] = ()

    def course_id_of(self, instance: Any) -> int | None:
        return instance.lab.course_id

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if self.course_id_of(instance) not in self.context.get("staff_course_ids", ()):
            data.update(dict.fromkeys(self.staff_only))
        return data


class AttemptSerializer(StaffViewSerializer):
    """An attempt. The VM name and namespace are shown to course staff only; the agent token to nobody."""

    lab = serializers.IntegerField(source="lab_id", read_only=True)
    course = serializers.IntegerField(source="lab.course_id", read_only=True)
    student = PersonSerializer(read_only=True)
    timestamps = AttemptTimestampsSerializer(source="*", read_only=True)
    time_left_seconds = serializers.SerializerMethodField()
    can_extend = serializers.SerializerMethodField(help_text="Whether the time limit may be extended now.")
    vm_name = serializers.CharField(read_only=True, allow_null=True, help_text="Staff only.")
    namespace = serializers.CharField(read_only=True, allow_null=True, help_text="Staff only.")
    failure_reason = serializers.CharField(
        source="failure_reason_shown",
        read_only=True,
        help_text="Why the attempt failed, in the request's language (Accept-Language); empty unless failed.",
    )
    stop_reason = serializers.CharField(
        read_only=True,
        help_text="Why it stopped: student or staff (the Stop button), expired (its time limit), left (no page of "
        "the student had it open for the lab's idle_stop_minutes); empty while it runs or if it failed.",
    )

    class Meta:
        model = Attempt
        fields = [
            "id",
            "lab",
            "course",
            "student",
            "number",
            "state",
            "phase",
            "node_name",
            "failure_reason",
            "stop_reason",
            "expires_at",
            "time_left_seconds",
            "extensions",
            "can_extend",
            "vcpus",
            "memory_mib",
            "timestamps",
            "vm_name",
            "namespace",
        ]
        read_only_fields = fields

    staff_only = ("vm_name", "namespace")

    def get_time_left_seconds(self, attempt: Attempt) -> int | None:
        left = attempt.time_left() if attempt.is_active else None
        return int(left.total_seconds()) if left is not None else None

    def get_can_extend(self, attempt: Attempt) -> bool:
        return attempt_can_extend(attempt)


class MeUpdateSerializer(StrictInputSerializer):
    time_zone = serializers.CharField(
        allow_blank=True,
        max_length=64,
        validators=[validate_time_zone],
        help_text="Your own clock, an IANA name such as Europe/Berlin; empty for your institution's.",
    )


class AttemptStartSerializer(StrictInputSerializer):
    lab = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="The lab to start an attempt of.")


class EmptyInputSerializer(StrictInputSerializer):
    """For actions that take no input: any key in the body is refused."""


class AuditEventSerializer(serializers.ModelSerializer):
    actor = PersonSerializer(read_only=True, allow_null=True)
    target = serializers.CharField(source="target_repr", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "action", "target_type", "target_id", "target", "data"]
        read_only_fields = fields


class TokenRequestSerializer(StrictInputSerializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, style={"input_type": "password"}, trim_whitespace=False)


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(read_only=True)


class ConflictDetailsSerializer(serializers.Serializer):
    """What a conflict is with, so that a client need not list to find it."""

    attempt_id = serializers.IntegerField(required=False, help_text="attempt_active: the attempt in progress.")
    run_id = serializers.IntegerField(required=False, help_text="run_in_progress: the check in progress.")


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    retry_after = serializers.IntegerField(required=False)
    # A field named "fields": DRF's metaclass moves it into the declared fields, Serializer.fields is untouched.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()), required=False
    )
    details = ConflictDetailsSerializer(required=False)


class ErrorSerializer(serializers.Serializer):
    """The one error format of the API."""

    error = ErrorDetailSerializer()

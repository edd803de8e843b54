"""Who am I, and API tokens: obtain one with a username and password, or revoke your own."""

from __future__ import annotations

from django.contrib.auth import authenticate
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import ErrorSerializer, MeSerializer, MeUpdateSerializer, TokenRequestSerializer, TokenSerializer
from portal.errors import ApplicationError
from portal.http import request_user
from portal.ratelimit import RateLimited, login_failures_forget, login_retry_after, throttled_message
from portal.services import api_token_create, api_token_revoke, user_time_zone_set


class MeView(APIView):
    @extend_schema(responses={200: MeSerializer}, summary="The signed-in user")
    def get(self, request: Request) -> Response:
        user = request_user(request)
        return Response(MeSerializer(user).data)

    @extend_schema(
        request=MeUpdateSerializer,
        responses={200: MeSerializer, 400: ErrorSerializer},
        summary="Choose your own time zone",
    )
    def patch(self, request: Request) -> Response:
        serializer = MeUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        user = request_user(request)
        if "time_zone" in serializer.validated_data:
            user = user_time_zone_set(actor=user, user=user, time_zone=serializer.validated_data["time_zone"])
        return Response(MeSerializer(user).data)


class TokenObtainView(APIView):
    """``POST`` a username and password for your API token (created on first use).

    Failed attempts count towards the same limits as the sign-in page.
    """

    # Credentials travel in the body: no session, and so no CSRF token, is involved.
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=TokenRequestSerializer,
        auth=[],
        responses={200: TokenSerializer, 400: ErrorSerializer, 429: ErrorSerializer},
        summary="Obtain your API token",
    )
    def post(self, request: Request) -> Response:
        serializer = TokenRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        username = serializer.validated_data["username"]
        retry_after = login_retry_after(request=request._request, username=username)
        if retry_after is not None:
            raise RateLimited(throttled_message(retry_after), retry_after=retry_after)
        # authenticate() sends user_login_failed on a wrong password, which the login throttle counts.
        user = authenticate(request._request, username=username, password=serializer.validated_data["password"])
        if user is None:
            raise ApplicationError(_("Wrong username or password."), code="authentication_failed", status_code=400)
        login_failures_forget(request=request._request, username=username)
        token = api_token_create(actor=user, user=user)
        return Response({"token": token.key})


class TokenRevokeView(APIView):
    @extend_schema(request=None, responses={204: None}, summary="Revoke your API token")
    def delete(self, request: Request) -> Response:
        user = request_user(request)
        api_token_revoke(actor=user, user=user, reason="owner")
        return Response(status=status.HTTP_204_NO_CONTENT)

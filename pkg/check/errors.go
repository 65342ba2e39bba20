package check

import apierrors "k8s.io/apimachinery/pkg/api/errors"

func isForbidden(err error) bool { return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) }

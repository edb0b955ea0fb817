package settlement.kafka;

import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.InvalidKeyException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.NameCallback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;

import org.apache.kafka.common.security.JaasContext;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.plain.PlainAuthenticateCallback;
import org.apache.kafka.common.security.plain.PlainLoginModule;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * SASL/PLAIN for Service Bus credentials: the JAAS {@code user_NAME="KEY"}
 * options are the namespace's shared access keys.
 *
 * <p>A client signs in with either
 * <ul>
 * <li>user NAME and password KEY ({@code SharedAccessKeyName}/{@code SharedAccessKey}
 *     in a connection string, {@code AzureNamedKeyCredential(NAME, KEY)}): checked
 *     as Kafka's own {@code PlainServerCallbackHandler} does; or</li>
 * <li>user NAME and password a shared access signature
 *     {@code SharedAccessSignature sr=URI&sig=SIG&se=EXPIRY&skn=NAME}
 *     ({@code AzureSasCredential}, {@code SharedAccessSignature=} in a connection
 *     string): accepted when {@code skn} is the user, {@code se} (epoch seconds)
 *     is in the future, {@code sr} is an {@code sb://} URI and {@code sig},
 *     URL-decoded, is the base64 HMAC-SHA256 of {@code sr + "\n" + se} (as the
 *     token spells them) keyed with NAME's KEY, as Service Bus signs it.</li>
 * </ul>
 * Which entity {@code sr} names is not checked: the principal is NAME, and
 * Kafka's ACLs for {@code User:NAME} decide what it may do. SASL/PLAIN sends
 * the client only "Invalid username or password", so why a token was refused
 * is logged here (without the token's signature).
 *
 * <p>Configured per listener:
 * {@code listener.name.sasl_plaintext.plain.sasl.server.callback.handler.class}.
 */
public class SasPlainServerCallbackHandler implements AuthenticateCallbackHandler {

    private static final Logger LOG = LoggerFactory.getLogger(SasPlainServerCallbackHandler.class);
    private static final String SAS_PREFIX = "SharedAccessSignature ";
    private static final String JAAS_USER_PREFIX = "user_";

    private List<AppConfigurationEntry> jaasConfigEntries;

    @Override
    public void configure(Map<String, ?> configs, String mechanism,
                          List<AppConfigurationEntry> jaasConfigEntries) {
        this.jaasConfigEntries = jaasConfigEntries;
    }

    @Override
    public void handle(Callback[] callbacks) throws UnsupportedCallbackException {
        String username = null;
        for (Callback callback : callbacks) {
            if (callback instanceof NameCallback) {
                username = ((NameCallback) callback).getDefaultName();
            } else if (callback instanceof PlainAuthenticateCallback) {
                PlainAuthenticateCallback plain = (PlainAuthenticateCallback) callback;
                plain.authenticated(authenticate(username, new String(plain.password())));
            } else {
                throw new UnsupportedCallbackException(callback);
            }
        }
    }

    private boolean authenticate(String username, String password) {
        if (username == null) {
            return false;
        }
        String key = JaasContext.configEntryOption(jaasConfigEntries, JAAS_USER_PREFIX + username,
                PlainLoginModule.class.getName());
        if (key == null) {
            LOG.warn("SASL/PLAIN refused user '{}': no shared access key of that name", username);
            return false;
        }
        if (!password.startsWith(SAS_PREFIX)) {
            return equal(password, key);
        }
        String refusal = sasRefusal(username, key, password.substring(SAS_PREFIX.length()));
        if (refusal != null) {
            LOG.warn("SASL/PLAIN refused user '{}': its shared access signature {}", username,
                    refusal);
        }
        return refusal == null;
    }

    /** Why the token is refused, or null when it is valid for {@code username}. */
    private static String sasRefusal(String username, String key, String token) {
        Map<String, String> fields = new HashMap<>();
        for (String part : token.split("&")) {
            int eq = part.indexOf('=');
            if (eq > 0) {
                fields.put(part.substring(0, eq), part.substring(eq + 1));
            }
        }
        String resource = fields.get("sr");
        String signature = fields.get("sig");
        String expiry = fields.get("se");
        if (resource == null || signature == null || expiry == null || fields.get("skn") == null) {
            return "is not 'SharedAccessSignature sr=URI&sig=SIG&se=EXPIRY&skn=KEYNAME'";
        }
        if (!fields.get("skn").equals(username)) {
            return "names key '" + fields.get("skn") + "', not the user";
        }
        if (!percentDecode(resource).startsWith("sb://")) {
            return "is for '" + resource + "', not an sb:// URI";
        }
        long expiresAt;
        try {
            expiresAt = Long.parseLong(expiry);
        } catch (NumberFormatException e) {
            return "has expiry '" + expiry + "', not epoch seconds";
        }
        if (expiresAt <= System.currentTimeMillis() / 1000) {
            return "expired at " + java.time.Instant.ofEpochSecond(expiresAt);
        }
        byte[] expected = hmacSha256(key, resource + "\n" + expiry);
        byte[] given;
        try {
            given = Base64.getDecoder().decode(percentDecode(signature));
        } catch (IllegalArgumentException e) {
            return "has a signature that is not base64";
        }
        if (!MessageDigest.isEqual(expected, given)) {
            return "is not signed with the key of that name";
        }
        return null;
    }

    /** URL decoding of %XX escapes; a '+' stays a '+' (base64 uses it). */
    private static String percentDecode(String text) {
        return URLDecoder.decode(text.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    private static byte[] hmacSha256(String key, String message) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
            return mac.doFinal(message.getBytes(StandardCharsets.UTF_8));
        } catch (NoSuchAlgorithmException | InvalidKeyException e) {
            throw new IllegalStateException("HmacSHA256 is part of every Java runtime", e);
        }
    }

    private static boolean equal(String given, String expected) {
        return MessageDigest.isEqual(given.getBytes(StandardCharsets.UTF_8),
                expected.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public void close() {
    }
}

// IgiNpcComponent.h - IgiRuntime (Unreal wrapper): one NPC's conversation with the igi daemon.
//
// Say() streams the NPC's reply: OnToken fires per token, then OnReplyDone (or OnError). All
// delegates fire on the game thread, inside the client's Pump(), which TickComponent drives (through
// UIgiSubsystem::PumpOncePerFrame, which also feeds the frame time to the budget helper).
//
// NPCs that act (protocol 1.1): set ReplyJsonSchema and every reply is a JSON object of that schema, delivered
// validated by OnStructuredReply as a JSON string (FJsonObjectConverter::JsonObjectStringToUStruct maps it onto a
// USTRUCT; GetJsonStringField reads one field in Blueprints). Tools lets the NPC call a game function instead:
// OnToolCall gives its name and validated arguments, and SendToolResult continues the NPC's turn.
#pragma once

#include <optional>
#include <string>

#include "Components/ActorComponent.h"
#include "CoreMinimal.h"

#include "igi/image.hpp"

#include "IgiNpcComponent.generated.h"

DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnToken, const FString&, Token, int32, Index);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnReplyDone, const FString&, FullText, const FString&, FinishReason);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnError, const FString&, Code, const FString&, Message);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiOnStructuredReply, const FString&, Json);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_ThreeParams(FIgiOnToolCall, const FString&, CallId, const FString&, ToolName,
                                               const FString&, ArgumentsJson);

/** A tool the NPC may call (create_session_request.tools). */
USTRUCT(BlueprintType)
struct IGIRUNTIME_API FIgiTool
{
	GENERATED_BODY()

	/** 1-64 of A-Z a-z 0-9 _ -, not starting with a digit or '-'. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI")
	FString Name;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI")
	FString Description;

	/** JSON Schema of the arguments object, as JSON text. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (MultiLine = true))
	FString ParametersJsonSchema = TEXT("{}");
};

class UIgiSubsystem;

UCLASS(ClassGroup = (AI), meta = (BlueprintSpawnableComponent))
class IGIRUNTIME_API UIgiNpcComponent : public UActorComponent
{
	GENERATED_BODY()

public:
	UIgiNpcComponent();

	/** NPC name or role (create_session_request.persona). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI")
	FString Persona = TEXT("Villager");

	/** System message of the chat template. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (MultiLine = true))
	FString SystemPrompt = TEXT("You are a villager in a fantasy game. Answer in one or two short sentences.");

	/** 0 = greedy. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "0.0", ClampMax = "5.0"))
	float Temperature = 0.7f;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "1"))
	int32 MaxTokens = 96;

	/** -100..100, higher is served first. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "-100", ClampMax = "100"))
	int32 Priority = 0;

	/** JSON Schema of every reply (JSON text; empty = free text). The replies arrive in OnStructuredReply. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (MultiLine = true))
	FString ReplyJsonSchema;

	/** Tools the NPC may call; a call arrives in OnToolCall. Read when the session opens (the first Say). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI")
	TArray<FIgiTool> Tools;

	/** Answers the NPC's tool call: the NPC continues its turn with Content (free text or JSON) in its context. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	bool SendToolResult(const FString& CallId, const FString& ToolName, const FString& Content);

	/** One string field of a JSON object (e.g. "line" of a structured reply); empty when absent. */
	UFUNCTION(BlueprintPure, Category = "IGI")
	static FString GetJsonStringField(const FString& Json, const FString& Field);

	/** Streams the NPC's answer to the player's line. False if a reply is already streaming. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	bool Say(const FString& Text);

	/** Say() with an image the NPC is shown (protocol 1.1; the daemon needs a vision projector). From C++:
	 *  igi::Image Frame; FString Error;
	 *  if (UIgiImageCapture::FromRenderTarget(Capture->TextureTarget, EIgiImageEncoding::Jpeg, 75, Frame, Error))
	 *      Npc->SayWithImage(TEXT("What do you see?"), Frame); */
	bool SayWithImage(const FString& Text, const igi::Image& Image);

	/** Cancels the reply in progress; OnReplyDone then reports FinishReason "cancelled". */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void Cancel();

	/** Explicit VRAM budget for the daemon (game-wide; overrides the budget helper's proposals). */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void SetVramBudgetMiB(int32 VramBudgetMiB);

	UFUNCTION(BlueprintPure, Category = "IGI")
	bool IsBusy() const { return !GenerateId.empty() || bSessionPending; }

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnToken OnToken;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnReplyDone OnReplyDone;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnError OnError;

	/** A reply constrained by ReplyJsonSchema (or with tools): its validated JSON text. After OnReplyDone. */
	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnStructuredReply OnStructuredReply;

	/** The NPC called a tool (FinishReason "tool_call"); answer with SendToolResult. */
	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnToolCall OnToolCall;

	virtual void TickComponent(float DeltaTime, ELevelTick TickType, FActorComponentTickFunction* ThisTickFunction) override;

protected:
	virtual void BeginPlay() override;
	virtual void EndPlay(const EEndPlayReason::Type EndPlayReason) override;

private:
	UIgiSubsystem* GetIgi() const;
	bool StartSay(const FString& Text);
	void StartGenerate();
	void Fail(const FString& Code, const FString& Message);

	std::string SessionId;   // daemon session, created lazily on the first Say()
	std::string GenerateId;  // msg_id of the generate_request in progress
	std::string SessionRequestId;
	bool bSessionPending = false;
	bool bEndedPlay = false;  // a session created after EndPlay is closed, not used
	FString PendingText;
	std::optional<igi::Image> PendingImage;
	bool bPendingToolResult = false;
	FString PendingCallId, PendingToolName, PendingToolContent;
};
